package main

import (
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/devicetest"
)

// TestDidYouMean: an unknown device, tool or flag gets the closest known
// name; a far one gets none.
func TestDidYouMean(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{Tools: cliCatalog, OnCall: cliAnswer})
	run(t, addr, "devices", "alias", devID, "kitchen").want(t, 0)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tools", "kitchn"}, "error: device_not_found: "},
		{[]string{"devices", "show", "kitchne"}, "  did you mean kitchen?\n"},
		{[]string{"call", "kitchn", "self.reboot"}, "  did you mean kitchen?\n"},
		{[]string{"call", "kitchen", "self.audio_speaker.set_volum", "volume=3"}, "error: tool_not_found: "},
		{[]string{"call", "kitchen", "set_volume", "volume=3"}, "  did you mean self.audio_speaker.set_volume?\n"},
		{[]string{"serve", "--adr", "x"}, "unknown flag: --adr (did you mean --addr?)"},
		{[]string{"tools", "--wid", "kitchen"}, "unknown flag: --wid (did you mean --wide?)"},
	} {
		r := run(t, addr, tc.args...)
		r.want(t, 1)
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: stderr %q, want %q", tc.args, r.stderr, tc.want)
		}
		if strings.HasPrefix(tc.want, "error:") && !strings.Contains(r.stderr, "did you mean") {
			t.Errorf("%v: no suggestion: %q", tc.args, r.stderr)
		}
	}
	r := run(t, addr, "tools", "bathroom")
	r.want(t, 1)
	if strings.Contains(r.stderr, "did you mean") {
		t.Errorf("a far name got a suggestion: %q", r.stderr)
	}
}

// TestDevicesRevokeUnknownCmd: revoking a known device says nothing more;
// revoking an id the gateway does not know revokes it, with a note and the
// closest known name (a mistyped alias is an id too); what is no id is not
// found.
func TestDevicesRevokeUnknownCmd(t *testing.T) {
	t.Parallel()
	addr := startGateway(t)
	connect(t, addr, devicetest.Config{Tools: cliCatalog, OnCall: cliAnswer})
	run(t, addr, "devices", "alias", devID, "kitchen").want(t, 0)

	r := run(t, addr, "devices", "revoke", "kitchen")
	r.want(t, 0)
	if r.stderr != "" || !strings.Contains(r.stdout, "its connection was closed") {
		t.Errorf("revoke kitchen: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	r = run(t, addr, "devices", "revoke", "kitchn")
	r.want(t, 0)
	if !strings.Contains(r.stdout, "revoked every credential of kitchn ") || !strings.Contains(r.stderr, "knows no device kitchn") ||
		!strings.Contains(r.stderr, "did you mean kitchen?") {
		t.Errorf("revoke kitchn: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	r = run(t, addr, "devices", "revoke", "02-0B-00-00-00-01")
	r.want(t, 0)
	if !strings.Contains(r.stdout, "of 02:0b:00:00:00:01 ") || !strings.Contains(r.stderr, "knows no device 02:0b:00:00:00:01") {
		t.Errorf("revoke a MAC never seen: stdout %q, stderr %q", r.stdout, r.stderr)
	}
	run(t, addr, "devices", "revoke", "no/such").want(t, 1)
}
