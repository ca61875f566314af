package ir_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/device/packs/ir"
)

// TestCheckNameScripts: letters of any script are names, with the combining
// marks that scripts such as Thai and Hindi write their vowels with.
func TestCheckNameScripts(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"tv_power", "空调 开", "ทีวี", "टीवी", "cafe\u0301", "café 2", "ঘর.আলো"} {
		if err := ir.CheckName(name); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", name, err)
		}
	}
	for name, want := range map[string]string{
		"tv/power":              `'/' is not allowed (letters with their marks, digits, space, _ - . only)`,
		"\u0301x":               "is a combining mark with no letter before it",
		"a \u0301":              "is a combining mark with no letter before it",
		" tv":                   "without leading or trailing spaces",
		strings.Repeat("é", 65): "longer than 64 characters",
	} {
		if err := ir.CheckName(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckName(%q) = %v, want %q", name, err, want)
		}
	}
	// 64 letters each with a decomposed accent are 64 characters once composed.
	if err := ir.CheckName(strings.Repeat("e\u0301", 64)); err != nil {
		t.Errorf("64 decomposed é: %v", err)
	}
}

// TestCodesComposedAndDecomposedAreOneName: "é" typed as e + U+0301 and as
// U+00E9 name the same code.
func TestCodesComposedAndDecomposedAreOneName(t *testing.T) {
	t.Parallel()
	c := ir.NewCodes(filepath.Join(t.TempDir(), "ir-codes.json"))
	if _, err := c.Put("cafe\u0301", []byte{1, 2}); err != nil {
		t.Fatal(err)
	}
	if code, err := c.Get("caf\u00e9"); err != nil || len(code) != 2 {
		t.Fatalf("Get(composed) = %x, %v", code, err)
	}
	if replaced, err := c.Put("caf\u00e9", []byte{3}); err != nil || !replaced {
		t.Fatalf("Put(composed) = %v, %v; want it to replace the decomposed one", replaced, err)
	}
	list, err := c.List()
	if err != nil || len(list) != 1 || list[0].Name != "caf\u00e9" || list[0].Bytes != 1 {
		t.Fatalf("List = %+v, %v; want the one code, under the composed name", list, err)
	}
	if err := c.Delete("cafe\u0301"); err != nil {
		t.Fatal(err)
	}
}

// TestCodesWrongTypedEntry: a hand-edited entry that is not a string is
// listed as invalid, saying why, and the other codes still work; only a
// file that is not JSON is called that.
func TestCodesWrongTypedEntry(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "ir-codes.json")
	if err := os.WriteFile(path, []byte(`{"codes":{"tv_power":"2600480091","num":5,"空调 开":"A1B2","list":[1]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	c := ir.NewCodes(path)
	list, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]ir.CodeInfo{}
	for _, info := range list {
		got[info.Name] = info
	}
	if got["num"].Invalid != "the number 5 is not a string of hex digits" ||
		got["list"].Invalid != "a list is not a string of hex digits" ||
		got["tv_power"].Bytes != 5 || got["空调 开"].Bytes != 2 {
		t.Fatalf("List = %+v", list)
	}
	if _, err := c.Get("tv_power"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("num"); err == nil || !strings.Contains(err.Error(), `code "num" in `+path+": the number 5 is not a string of hex digits") {
		t.Fatalf("Get(num) = %v", err)
	}
	// A save keeps the entry as it was for the person to fix.
	if _, err := c.Put("fan", []byte{1}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), `"num": 5`) {
		t.Fatalf("after Put the file is %s", b)
	}

	for content, want := range map[string]string{
		`{"codes":`:    "is not valid JSON",
		`{"codes":[]}`: `must be {"codes": {"name": "hex", ...}}`,
		`["tv_power"]`: `must be {"codes": {"name": "hex", ...}}`,
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("file %s: List = %v, want %q", content, err, want)
		}
	}
}
