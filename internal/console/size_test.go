package console

import (
	"io/fs"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestSizeAsDocumented: the embedded console is within the size
// docs/console.md gives ("under N KB").
func TestSizeAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/console.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`no framework, under (\d+) KB`).FindSubmatch(doc)
	if m == nil {
		t.Fatal(`docs/console.md does not say "no framework, under N KB"`)
	}
	limit, _ := strconv.Atoi(string(m[1]))
	var total int64
	err = fs.WalkDir(files, "static", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		total += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if total > int64(limit)*1000 {
		t.Errorf("the console is %d bytes, over the %d KB docs/console.md says", total, limit)
	}
}
