package store

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzRedactDSN: whatever the URL around it, a password given in the user
// info or as a password parameter never reaches a log or an error.
func FuzzRedactDSN(f *testing.F) {
	f.Add("postgres", "mcpgate", "s3cr3t!", "db.example:5432", "mcpgate", "sslmode=require")
	f.Add("postgresql", "u", "p@ss:w/rd", "[::1]:5432", "x", "")
	f.Add("mysql", "root", "hunter2", "h", "", "a=b&c")
	f.Fuzz(func(t *testing.T, scheme, user, pass, host, db, query string) {
		if len(pass) < 4 || strings.Contains(scheme+user+host+db+query, pass) {
			t.Skip() // too short or repeated elsewhere to tell apart
		}
		if !validScheme(scheme) {
			t.Skip() // not a URL: Open shows no more than the scheme of those
		}
		encoded := url.QueryEscape(pass)
		u := scheme + "://" + url.PathEscape(user) + ":" + url.PathEscape(pass) + "@" + host + "/" + db
		inQuery := u + "?" + query + "&password=" + encoded
		for _, dsn := range []string{u, inQuery} {
			got := redactDSN(dsn)
			for _, form := range []string{pass, url.PathEscape(pass), encoded} {
				if strings.Contains(got, form) {
					t.Fatalf("redactDSN(%q) = %q shows the password", dsn, got)
				}
			}
		}
	})
}
