// Package redact keeps credentials that URLs carry (a password, ?token=)
// out of logs and of what peers are told.
package redact

import (
	"errors"
	"fmt"
	"net/url"
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
