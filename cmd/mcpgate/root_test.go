package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/oauth"
)

// TestHelpValueNames: pflag takes a backquoted phrase in a flag's usage as
// its value name, so "`mcpgate devices token`" made serve --help read
// "--device-auth mcpgate devices token". Every flag of every command must
// show a one-word value name, and every command's help must render.
func TestHelpValueNames(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		check := func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \t") {
				t.Errorf("%s --%s: value name %q (a backquoted phrase in its usage)", c.CommandPath(), f.Name, name)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
		if err := c.Help(); err != nil {
			t.Errorf("%s --help: %v", c.CommandPath(), err)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)

	r := run(t, "http://127.0.0.1:1", "serve", "--help")
	r.want(t, 0)
	if !strings.Contains(r.stdout, "--device-auth string") {
		t.Errorf("serve --help does not show --device-auth string:\n%s", r.stdout)
	}
	// Patterns given add to the camera's default (serve.go), not replace it.
	if !strings.Contains(r.stdout, "self.camera.*=90s stays unless that pattern is given") {
		t.Errorf("serve --help does not say the camera's --tool-timeout default stays:\n%s", r.stdout)
	}
	// In upstream mode it also bounds the voice server's dial and hello (docs/upstream.md).
	if !strings.Contains(r.stdout, "with --upstream, the voice server has as long to connect and answer it") {
		t.Errorf("serve --help does not say --hello-timeout bounds the voice server too:\n%s", r.stdout)
	}
}

// TestVersionFlag: --version prints what the version command prints.
func TestVersionFlag(t *testing.T) {
	a := run(t, "http://127.0.0.1:1", "--version")
	a.want(t, 0)
	b := run(t, "http://127.0.0.1:1", "version")
	b.want(t, 0)
	if a.stdout != b.stdout || !strings.HasPrefix(a.stdout, "mcpgate ") {
		t.Errorf("--version printed %q, version %q", a.stdout, b.stdout)
	}
}

// TestVersionOf: a build without -ldflags nor a module version (go build
// in a checkout, with -buildvcs) says which commit it is, not just "dev".
func TestVersionOf(t *testing.T) {
	t.Parallel()
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	const rev = "55ebaa22c4ed7250dd2700920aed6d8a1b9ca04f"
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "dev"},
		{"module version", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: vcs("vcs.revision", rev)}, "v1.2.3"},
		{"devel without vcs", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "dev"},
		{"devel, clean checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs", "git", "vcs.revision", rev, "vcs.time", "2026-11-26T14:32:29Z", "vcs.modified", "false")},
			"dev (55ebaa2, 2026-11-26T14:32:29Z)"},
		{"devel, modified checkout", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs.revision", rev, "vcs.time", "2026-11-26T14:32:29Z", "vcs.modified", "true")},
			"dev (55ebaa2, 2026-11-26T14:32:29Z, modified)"},
		{"revision alone", &debug.BuildInfo{Settings: vcs("vcs.revision", rev)}, "dev (55ebaa2)"},
	} {
		if got := versionOf(tc.bi); got != tc.want {
			t.Errorf("%s: versionOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestArityUsageLine: a wrong number of arguments names the command and
// prints its usage line, for every command that checks its arguments.
func TestArityUsageLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"call", "kitchen"}, "call: requires at least 2 arg(s), only received 1\nUsage: mcpgate call DEVICE TOOL [key=value | key:=json]..."},
		{[]string{"tools"}, "tools: accepts 1 arg(s), received 0\nUsage: mcpgate tools DEVICE"},
		{[]string{"devices", "alias", "kitchen"}, "devices alias: accepts 2 arg(s), received 1\nUsage: mcpgate devices alias DEVICE NEW_ALIAS"},
		{[]string{"devices", "token"}, "Usage: mcpgate devices token DEVICE"},
		{[]string{"devices", "forget", "a", "b"}, "devices forget: accepts 1 arg(s), received 2\nUsage: mcpgate devices forget DEVICE [flags]"},
		{[]string{"keys", "list", "extra"}, "keys list: unknown command \"extra\" for \"mcpgate keys list\"\nUsage: mcpgate keys list"},
		{[]string{"version", "x"}, "Usage: mcpgate version"},
		// A typo of a subcommand: named, not a help page with exit 0.
		{[]string{"devices", "shw"}, "devices: unknown command \"shw\" for \"mcpgate devices\" (did you mean show?)"},
		{[]string{"keys", "lst"}, "keys: unknown command \"lst\" for \"mcpgate keys\" (did you mean list?)"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := run(t, "http://127.0.0.1:1", tc.args...)
			r.want(t, 1)
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr:\n%s\nwant it to contain:\n%s", r.stderr, tc.want)
			}
		})
	}
}

// TestAuditHelpNamesEveryAdminTool: audit --help names the tool of every
// kind of administrative record the log holds (docs/audit.md).
func TestAuditHelpNamesEveryAdminTool(t *testing.T) {
	r := run(t, "http://127.0.0.1:1", "audit", "--help")
	r.want(t, 0)
	for _, tool := range []string{hub.AuditForget, hub.AuditRevoke, api.AuditKeyCreate, api.AuditKeyRevoke, oauth.AuditGrant} {
		if !strings.Contains(r.stdout, tool) {
			t.Errorf("audit --help does not name %s:\n%s", tool, r.stdout)
		}
	}
}

// TestHelpShowsNoSecrets: a token or URL in the environment is no flag
// default, so --help never prints it.
func TestHelpShowsNoSecrets(t *testing.T) {
	t.Setenv("MCPGATE_ENDPOINT_TOKEN", "supersecret")
	t.Setenv("MCPGATE_ENDPOINT_URL", "ws://127.0.0.1:1/mcp/endpoint?token=urlsecret")
	r := run(t, "http://127.0.0.1:1", "bridge", "--help")
	r.want(t, 0)
	if strings.Contains(r.stdout, "supersecret") || strings.Contains(r.stdout, "urlsecret") {
		t.Errorf("bridge --help shows a secret from the environment:\n%s", r.stdout)
	}
	// Still read from there: a URL that is no WebSocket's is refused, its
	// token hidden.
	t.Setenv("MCPGATE_ENDPOINT_URL", "http://127.0.0.1:1/mcp/endpoint?token=urlsecret")
	r = run(t, "http://127.0.0.1:1", "bridge", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "want ws(s)://") || strings.Contains(r.stderr, "secret") {
		t.Errorf("bridge with MCPGATE_ENDPOINT_URL an http URL: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestBridgeTakesKey: bridge sends the API key of --key or MCPGATE_API_KEY
// as its token, as the endpoint takes keys, when no other token is given;
// two tokens given are refused rather than one ignored.
func TestBridgeTakesKey(t *testing.T) {
	tokens := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case tokens <- r.URL.Query().Get("token"):
		default:
		}
		http.Error(w, "invalid or missing token", http.StatusUnauthorized)
	}))
	defer srv.Close()
	endpoint := "ws" + strings.TrimPrefix(srv.URL, "http") + "/mcp/endpoint"
	for _, tc := range []struct {
		name          string
		env           [2]string // MCPGATE_ENDPOINT_TOKEN, MCPGATE_API_KEY
		args          []string
		want, wantErr string
	}{
		{"--key", [2]string{}, []string{"--key", "mgk_flag", "bridge", "--url", endpoint}, "mgk_flag", ""},
		{"MCPGATE_API_KEY", [2]string{"", "mgk_env"}, []string{"bridge", "--url", endpoint}, "mgk_env", ""},
		{"--key over MCPGATE_ENDPOINT_TOKEN", [2]string{"tok_env", ""}, []string{"bridge", "--key", "mgk_flag", "--url", endpoint}, "mgk_flag", ""},
		{"MCPGATE_ENDPOINT_TOKEN over MCPGATE_API_KEY", [2]string{"tok_env", "mgk_env"}, []string{"bridge", "--url", endpoint}, "tok_env", ""},
		{"the URL's token over MCPGATE_API_KEY", [2]string{"", "mgk_env"}, []string{"bridge", "--url", endpoint + "?token=tok_url"}, "tok_url", ""},
		{"--token and --key", [2]string{}, []string{"bridge", "--token", "t", "--key", "k", "--url", endpoint}, "", "give one token"},
		{"?token= and --key", [2]string{}, []string{"bridge", "--key", "k", "--url", endpoint + "?token=t"}, "", "give one token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			select {
			case <-tokens: // of a case before
			default:
			}
			t.Setenv("MCPGATE_ENDPOINT_TOKEN", tc.env[0])
			t.Setenv("MCPGATE_API_KEY", tc.env[1])
			r := run(t, "http://127.0.0.1:1", append(tc.args, "--", "true")...)
			r.want(t, 1)
			if tc.wantErr != "" {
				if !strings.Contains(r.stderr, tc.wantErr) {
					t.Errorf("stderr %q, want %q", r.stderr, tc.wantErr)
				}
				return
			}
			select {
			case got := <-tokens:
				if got != tc.want {
					t.Errorf("token %q, want %q", got, tc.want)
				}
			default:
				t.Fatalf("the bridge did not dial the endpoint: %s", r.stderr)
			}
		})
	}
}

func TestParseEnv(t *testing.T) {
	env, err := parseEnv([]string{"FOO=x=1,y=2", `BAR="q"`, "EMPTY="})
	if err != nil || env["FOO"] != "x=1,y=2" || env["BAR"] != `"q"` || env["EMPTY"] != "" || len(env) != 3 {
		t.Errorf("parseEnv: %q, %v", env, err)
	}
	if _, err := parseEnv([]string{"NOVALUE"}); err == nil {
		t.Error("an item without = accepted")
	}
}

func TestChatCallName(t *testing.T) {
	for _, tc := range []struct {
		c    agent.CallInfo
		want string
	}{
		{agent.CallInfo{CallStart: agent.CallStart{Function: "self_lamp_on", Device: "02:00:00:00:00:01", Tool: "self.lamp.on"}}, "self.lamp.on"},
		{agent.CallInfo{CallStart: agent.CallStart{Function: "probe__fail", Device: "endpoint-probe", Tool: "fail"}}, "probe.fail"},
		{agent.CallInfo{CallStart: agent.CallStart{Function: "made_up"}}, "made_up"},
	} {
		if got := callName(tc.c); got != tc.want {
			t.Errorf("callName(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
}
