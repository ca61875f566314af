// Package redact keeps credentials that URLs carry (a password, ?token=)
// out of logs and of what peers are told.
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

// InText hides rawURL's query (where tokens go) wherever msg repeats it:
// as is, quoted (%q) or escaped, and each of its values of 4 bytes or more
// however quoted. It never returns the query, even of a URL that does not
// parse.
func InText(msg, rawURL string) string {
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

// ErrIn is err with rawURL's query hidden wherever its text repeats it
// (InText), still matching what err wraps with errors.Is and errors.As.
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

type hiddenErr struct {
	msg string
	err error
}

func (e *hiddenErr) Error() string { return e.msg }
func (e *hiddenErr) Unwrap() error { return e.err }
