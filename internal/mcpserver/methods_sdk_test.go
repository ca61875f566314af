package mcpserver

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSDKMethodsMatchGoSDK: sdkMethods is the set of methods go-sdk's server
// handles (serverMethodInfos in its source), so that an upgrade that adds
// one fails here rather than answering it "method not found".
func TestSDKMethodsMatchGoSDK(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/modelcontextprotocol/go-sdk").Output()
	if err != nil {
		t.Fatalf("finding go-sdk's source: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "mcp")
	names := map[string]string{} // Go constant → method
	var infos string
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	constant := regexp.MustCompile(`(?m)^\s+((?:method|notification)\w+)\s+= "([^"]+)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range constant.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = m[2]
		}
		if _, rest, ok := strings.Cut(string(b), "var serverMethodInfos = map[string]methodInfo{"); ok {
			infos, _, _ = strings.Cut(rest, "\n}")
		}
	}
	if infos == "" {
		t.Fatal("serverMethodInfos not found in go-sdk's source: read how it dispatches and update sdkMethods")
	}
	handled := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(\w+):`).FindAllStringSubmatch(infos, -1) {
		method, ok := names[m[1]]
		if !ok {
			t.Fatalf("go-sdk's %s: no string constant found", m[1])
		}
		handled[method] = true
	}
	if !maps.Equal(handled, sdkMethods) {
		t.Errorf("sdkMethods = %v\ngo-sdk handles %v", slices.Sorted(maps.Keys(sdkMethods)), slices.Sorted(maps.Keys(handled)))
	}
}
