package endpoint

import (
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// FuzzSanitizeName checks the rules SanitizeName documents for the ?name=
// of /mcp/endpoint (and a server's own name): lower-case letters, digits,
// '-' and '_' only, no run of '-', nothing to trim at either end, at most
// maxNameLen bytes, never a name that reads as a MAC (it would shadow a
// device), nothing invented, and a valid name kept as it is.
func FuzzSanitizeName(f *testing.F) {
	for _, s := range []string{
		"calc", "Calc Server", "example-servers/everything", "@scope/pkg", "a..b__c", "mcp-server",
		"aabbccddeeff", "AA:BB:CC:DD:EE:FF", "aa-bb-cc-dd-ee-ff", "aa_bb_cc_dd_ee_ff", "--aabbccddeeff--",
		"计算器", "Ｃａｌｃ", "\u212a", "İstanbul", "\x00\xff\xfe", "a\u200bb", "-", "_", "_-_", "a-_-b", "",
		strings.Repeat("x", 100), "-" + strings.Repeat("y", 47) + "-", strings.Repeat("_", 48) + "a",
		strings.Repeat("ab-", 20), "../../etc/passwd", "a b\tc\nd", "%2e%2e", "endpoint-calc-2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := SanitizeName(s)
		if got == "" {
			return // nothing left: the door answers 400
		}
		if len(got) > maxNameLen {
			t.Errorf("SanitizeName(%q) = %q: %d bytes, over %d", s, got, len(got), maxNameLen)
		}
		for _, c := range []byte(got) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				t.Fatalf("SanitizeName(%q) = %q: byte %q is not a lower-case letter, digit, '-' or '_'", s, got, c)
			}
		}
		if strings.Trim(got, "-_") != got || strings.Contains(got, "--") {
			t.Errorf("SanitizeName(%q) = %q: '-' or '_' at an end, or a run of '-'", s, got)
		}
		if strings.Trim(got, "-_") == "" || strings.IndexFunc(got, func(r rune) bool { return r >= 'a' && r <= 'z' || r >= '0' && r <= '9' }) < 0 {
			t.Errorf("SanitizeName(%q) = %q: no letter or digit", s, got)
		}
		// Its own device id: a MAC would be normalised to another string.
		if id, err := xiaozhi.NormalizeDeviceID(got); err != nil || id != got {
			t.Errorf("SanitizeName(%q) = %q reads as device id %q (%v)", s, got, id, err)
		}
		if again := SanitizeName(got); again != got {
			t.Errorf("SanitizeName(%q) = %q, but SanitizeName(%q) = %q: a valid name must be kept", s, got, got, again)
		}
		// The letters, digits and '_' of the name come from the input, in
		// order and together; "mcp-" is added only before a MAC-like name.
		src := kept(strings.ToLower(s))
		if !strings.Contains(src, kept(got)) {
			rest, ok := strings.CutPrefix(got, "mcp-")
			if id, err := xiaozhi.NormalizeDeviceID(rest); !ok || err != nil || id == rest || !strings.Contains(src, kept(rest)) {
				t.Errorf("SanitizeName(%q) = %q: %q is not taken from the input", s, got, kept(got))
			}
		}
	})
}

// kept returns the bytes of s that SanitizeName keeps as they are.
func kept(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' {
			b.WriteByte(c)
		}
	}
	return b.String()
}
