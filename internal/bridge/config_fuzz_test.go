package bridge

import (
	"encoding/json"
	"net/url"
	"testing"
)

// FuzzParseConfig feeds arbitrary files to ParseConfig, which reads the
// mcpServers file given to `mcpgate bridge --config`. It must never panic;
// a refusal has a message; what it accepts is one server per enabled entry,
// sorted by name, each either a command or an http(s) URL with a host, and
// a list that Run accepts as it is.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		// From the tests and docs/endpoint.md, docs/mcp.md.
		`{"mcpServers": {
			"calc": {"command": "python", "args": ["calc.py"], "env": {"K": "V"}},
			"notes": {"type": "http", "url": "http://127.0.0.1:3000/mcp"},
			"off": {"command": "x", "disabled": true}}}`,
		`{"mcpServers": {
			"everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
			"calc": {"command": "python", "args": ["calc_server.py"], "env": {"CALC_PRECISION": "6"}},
			"notes": {"type": "http", "url": "http://127.0.0.1:3000/mcp", "headers": {"Authorization": "Bearer xyz"}},
			"old": {"command": "legacy-server", "disabled": true}}}`,
		`{"mcpServers": {"devices": {"command": "npx", "args": ["-y", "mcp-remote", "http://127.0.0.1:8000/mcp"]}}}`,
		`{"mcpServers": {"devices": {"url": "http://gw.lan:8000/mcp", "headers": {"Authorization": "Bearer mgk_..."}}}}`,
		`{"mcpServers": {"a": {"type": "STDIO", "command": "a"}, "b": {"type": "streamable-http", "url": "https://[::1]:9/x"}}}`,
		`{"mcpServers": {"": {"command": "x"}}}`,
		`{"mcpServers": {"a": {"command": "x"}, "a": {"url": "http://h"}}}`,
		`{"MCPSERVERS": {"a": {"Command": "x", "DISABLED": false}}}`,
		// Broken.
		`{}`, `null`, `[]`, ``, `{"mcpServers": {}}`, `{"mcpServers": null}`, `{"mcpServers": []}`,
		`{"mcpServers": {"a": {}}}`,
		`{"mcpServers": {"a": {"type": "sse", "url": "http://x"}}}`,
		`{"mcpServers": {"a": {"url": "ftp://x"}}}`,
		`{"mcpServers": {"a": {"url": "http://"}}}`,
		`{"mcpServers": {"a": {"url": "http://%zz"}}}`,
		`{"mcpServers": {"a": {"command": "x", "url": "http://h"}}}`,
		`{"mcpServers": {"a": {"command": "x", "disabled": true}}}`,
		`{"mcpServers": {"a": {"command": 5}}}`,
		`{"mcpServers": {"a": {"command": "x", "args": "calc.py"}}}`,
		`{"mcpServers": {"a": {"command": "x", "env": {"K": 1}}}}`,
		`{"mcpServers": {"a": {"command": "x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		servers, err := ParseConfig(data)
		if err != nil {
			if err.Error() == "" || servers != nil {
				t.Fatalf("ParseConfig(%q) = %v, %q: want no servers and a message", data, servers, err)
			}
			return
		}
		if len(servers) == 0 {
			t.Fatalf("ParseConfig(%q) accepted a config with no servers", data)
		}
		// The entries as json reads them again: what was kept must be what
		// is enabled, under its own key.
		var file struct {
			MCPServers map[string]struct {
				Command  string `json:"command"`
				URL      string `json:"url"`
				Disabled bool   `json:"disabled"`
			} `json:"mcpServers"`
		}
		if err := json.Unmarshal(data, &file); err != nil {
			t.Fatalf("ParseConfig(%q) accepted what json refuses: %v", data, err)
		}
		enabled := 0
		for _, e := range file.MCPServers {
			if !e.Disabled {
				enabled++
			}
		}
		if len(servers) != enabled {
			t.Fatalf("ParseConfig(%q) gave %d servers for %d enabled entries", data, len(servers), enabled)
		}
		for i, s := range servers {
			if i > 0 && servers[i-1].Name >= s.Name {
				t.Fatalf("ParseConfig(%q): names not sorted and unique: %q then %q", data, servers[i-1].Name, s.Name)
			}
			e, ok := file.MCPServers[s.Name]
			if !ok || e.Disabled || e.Command != s.Command || e.URL != s.URL {
				t.Fatalf("ParseConfig(%q): server %+v is not the enabled entry %q (%+v, %v)", data, s, s.Name, e, ok)
			}
			if (s.Command == "") == (s.URL == "") {
				t.Fatalf("ParseConfig(%q): server %q wants exactly one of command and url: %+v", data, s.Name, s)
			}
			if s.URL != "" {
				u, err := url.Parse(s.URL)
				if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
					t.Fatalf("ParseConfig(%q): server %q has url %q, not http(s)://host (%v)", data, s.Name, s.URL, err)
				}
			}
		}
		// `mcpgate bridge --config` hands the list to Run unchanged.
		cfg := Config{URL: "ws://127.0.0.1:8000/mcp/endpoint", Servers: servers}
		if err := cfg.fill(); err != nil {
			t.Fatalf("ParseConfig(%q) accepted servers that Run refuses: %v", data, err)
		}
	})
}
