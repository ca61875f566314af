package api_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hub"
)

// Every error code the REST API answers with (its handlers, and those of
// the packages that serve routes under /api/ and the readiness check) is a
// row of docs/api.md's error table, and every row is a code it answers.
func TestErrorCodesAreDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| \\d{3} \\| `([a-z_]+)` \\|").FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}

	written := map[string]bool{}
	for _, c := range hub.Codes() {
		written[c] = c != "ok"
	}
	// A code is a string literal given to one of the error writers (not
	// the OAuth protocol's, whose errors are RFC 6749's), or returned with
	// its status (chatErrorCode).
	call := regexp.MustCompile(`(?:writeError|writeAPIError|WriteError)\([^"\n]*?"([a-z_]+)"|fail\(http\.Status\w+, "([a-z_]+)"|return "([a-z_]+)", http\.Status`)
	var files []string
	for _, pattern := range []string{"*.go", "../auth/http.go", "../gateway/provision.go", "../vision/vision.go", "../oauth/oauth.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil || len(m) == 0 {
			t.Fatalf("%s: %v, %d files", pattern, err, len(m))
		}
		files = append(files, m...)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllSubmatch(src, -1) {
			written[string(m[1])+string(m[2])+string(m[3])] = true
		}
	}
	for c, ok := range written {
		if ok && !documented[c] {
			t.Errorf("the API answers %s, which docs/api.md's error table lacks", c)
		}
	}
	for c := range documented {
		if !written[c] {
			t.Errorf("docs/api.md's error table has %s, which the API does not answer with", c)
		}
	}
}
