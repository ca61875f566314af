// Package redact keeps credentials that URLs carry (a password, ?token=),
// and secrets such as an API key a provider echoes, out of logs and of what
// peers are told.
package redact

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// URL is u without its password and with every query value replaced by
// REDACTED: a query often carries a token or key.
func URL(u *url.URL) string {
	c := *u
	if c.RawQuery != "" {
		q := c.Query()
		for _, vs := range q {
			for i := range vs {
				vs[i] = "REDACTED"
			}
		}
		c.RawQuery = q.Encode()
	}
	return c.Redacted()
}

// RawURL is URL of a URL in text; "" when it does not parse.
func RawURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return URL(u)
}

// Err is err without the URL an *url.Error names (net/http's errors repeat
// the whole URL, query included).
func Err(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// InText hides rawURL's query (where tokens go) and the password of its
// user:password@ wherever msg repeats them: the query as is, quoted (%q) or
// escaped, and each of its values of 4 bytes or more however quoted; the
// password as url.URL.Redacted does (user:xxxxx@), and alone when it is 4
// bytes or more. It never returns the query or the password, even of a URL
// that does not parse. InText(raw, raw) is the text of a URL to show.
func InText(msg, rawURL string) string {
	msg = hidePassword(msg, rawURL)
	_, query, ok := strings.Cut(rawURL, "?")
	if !ok || query == "" {
		return msg
	}
	quoted := strconv.Quote(query)
	forms := []string{query, quoted[1 : len(quoted)-1], url.QueryEscape(query), url.PathEscape(query)}
	if u, err := url.Parse(rawURL); err == nil {
		forms = append(forms, u.RawQuery, u.Query().Encode())
	}
	for _, f := range forms {
		if f != "" {
			msg = strings.ReplaceAll(msg, f, "REDACTED")
		}
	}
	for _, kv := range strings.Split(query, "&") {
		if _, v, ok := strings.Cut(kv, "="); ok && len(v) >= 4 {
			for _, f := range []string{v, strconv.Quote(v), url.QueryEscape(v)} {
				msg = strings.ReplaceAll(msg, strings.Trim(f, `"`), "REDACTED")
			}
		}
	}
	return msg
}

// ErrIn is err with rawURL's query and password hidden wherever its text
// repeats them (InText), still matching what err wraps with errors.Is and
// errors.As.
func ErrIn(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := InText(msg, rawURL); red != msg {
		return &hiddenErr{msg: red, err: err}
	}
	return err
}

// hidePassword hides the password of rawURL's user:password@ in msg. The
// URL need not parse: the user information is what comes before the last
// '@' of the text between "://" and the path, query or fragment.
func hidePassword(msg, rawURL string) string {
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return msg
	}
	authority := rest[:strings.IndexAny(rest+"/", "/?#")]
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return msg
	}
	userinfo := authority[:at]
	user, pass, ok := strings.Cut(userinfo, ":")
	if !ok || pass == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, userinfo+"@", user+":xxxxx@")
	forms := []string{pass}
	if p, err := url.PathUnescape(pass); err == nil {
		forms = append(forms, p, url.QueryEscape(p))
	}
	for _, f := range forms {
		if len(f) >= 4 {
			msg = strings.ReplaceAll(msg, f, "xxxxx")
			q := strconv.Quote(f)
			msg = strings.ReplaceAll(msg, q[1:len(q)-1], "xxxxx")
		}
	}
	return msg
}

type hiddenErr struct {
	msg string
	err error
}

func (e *hiddenErr) Error() string { return e.msg }
func (e *hiddenErr) Unwrap() error { return e.err }

// secretRun is the shortest run of a secret's bytes that Secret hides:
// providers echo a key whole or cut (sk-test-secret-123…), and 8 bytes
// say too much of a key yet rarely occur by chance.
const secretRun = 8

// Secret is msg with secret hidden wherever it shows whole, and with every
// run of secretRun bytes or more of it (a key a provider echoes cut)
// replaced by REDACTED. An empty secret hides nothing.
func Secret(msg, secret string) string {
	if secret == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, secret, "REDACTED")
	if len(secret) <= secretRun {
		return msg
	}
	// Every run of secretRun or more bytes of secret is covered by its
	// windows of secretRun bytes: mark each window's matches, then replace
	// each marked stretch.
	hide := make([]bool, len(msg))
	found := false
	for i := 0; i+secretRun <= len(secret); i++ {
		w := secret[i : i+secretRun]
		for at := 0; ; {
			j := strings.Index(msg[at:], w)
			if j < 0 {
				break
			}
			for k := at + j; k < at+j+secretRun; k++ {
				hide[k] = true
			}
			found = true
			at += j + 1
		}
	}
	if !found {
		return msg
	}
	var b strings.Builder
	for i := 0; i < len(msg); i++ {
		if !hide[i] {
			b.WriteByte(msg[i])
			continue
		}
		b.WriteString("REDACTED")
		for i+1 < len(msg) && hide[i+1] {
			i++
		}
	}
	return b.String()
}
