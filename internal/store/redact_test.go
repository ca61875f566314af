package store

import (
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FuzzRedactDSN: whatever the URL around it, a password given in the user
// info or as a password parameter never reaches a log or an error, nor
// the reason pgx gives for not parsing it.
func FuzzRedactDSN(f *testing.F) {
	f.Add("postgres", "mcpgate", "s3cr3t!", "db.example:5432", "mcpgate", "sslmode=require")
	f.Add("postgresql", "u", "p@ss:w/rd", "[::1]:5432", "x", "")
	f.Add("mysql", "root", "hunter2", "h", "", "a=b&c")
	f.Fuzz(func(t *testing.T, scheme, user, pass, host, db, query string) {
		if len(pass) < 4 {
			return // too short to tell apart from the rest
		}
		if !validScheme(scheme) {
			return // not a URL: Open shows no more than its scheme (FuzzParseDSN)
		}
		encoded := url.QueryEscape(pass)
		dsns := func(pw string) []string {
			u := scheme + "://" + url.PathEscape(user) + ":" + url.PathEscape(pw) + "@" + host + "/" + db
			return []string{u, u + "?" + query + "&password=" + url.QueryEscape(pw)}
		}
		// What the same DSN shows with another password: text that is there
		// too (the scheme's "a000:" holding "000:", the escaped user "%200001"
		// holding "0000") is the rest of the DSN, not the password.
		placeholder := dsns("pLaCeHoLdEr9") // found nowhere else, so the guard never trips on it
		for i, dsn := range dsns(pass) {
			got, without := redactDSN(dsn), redactDSN(placeholder[i])
			reason, reasonWithout := parseReason(dsn), parseReason(placeholder[i])
			for _, form := range []string{pass, url.PathEscape(pass), encoded} {
				if strings.Contains(got, form) && !strings.Contains(without, form) {
					t.Fatalf("redactDSN(%q) = %q shows the password", dsn, got)
				}
				if strings.Contains(reason, form) && !strings.Contains(reasonWithout, form) {
					t.Fatalf("pgParseReason for %q = %q shows the password", dsn, reason)
				}
			}
		}
	})
}

// parseReason is pgParseReason of pgx's error parsing dsn, or "".
func parseReason(dsn string) string {
	if _, err := pgxpool.ParseConfig(dsn); err != nil {
		return pgParseReason(err, dsn)
	}
	return ""
}
