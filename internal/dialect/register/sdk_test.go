package register_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// The SDK's side of refused registrations, against a gateway that takes at
// most 3 tools per device: the *device.RegistrationError of a whole refusal
// (Connect fails) and of a partial one (Connect succeeds, Registered and
// Register report it).

// longName is one byte over the dialect's limit: the SDK sends it, the
// gateway rejects that tool alone.
var longName = strings.Repeat("x", 129)

func startMaxTools(t *testing.T, maxTools int) *fixture {
	t.Helper()
	gw, _ := gatewaytest.Start(t, gateway.Config{MaxTools: maxTools})
	return &fixture{gw: gw, hub: gw.Hub(), url: "ws://" + gw.Addr() + "/xiaozhi/v1/"}
}

func tools(names ...string) []device.Tool {
	out := make([]device.Tool, len(names))
	for i, n := range names {
		out[i] = device.Tool{Name: n, Handler: ok}
	}
	return out
}

func registrationError(t *testing.T, err error) *device.RegistrationError {
	t.Helper()
	re, isRE := errors.AsType[*device.RegistrationError](err)
	if !isRE {
		t.Fatalf("err = %v (%T), want a *device.RegistrationError", err, err)
	}
	return re
}

// A registration refused as a whole: Connect fails with the gateway's code
// and reason, no tool is registered, and the device never reaches the hub.
func TestSDKRegistrationRefused(t *testing.T) {
	t.Parallel()
	f := startMaxTools(t, 3)
	const id = "02:00:00:00:06:50"
	c, err := device.NewClient(device.ClientOptions{URL: f.url, DeviceID: id, Server: newServer(t, tools("a", "b", "c", "d")...)})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.Connect(t.Context())
	if err == nil {
		sess.Close()
		t.Fatal("Connect succeeded with more tools than the gateway takes")
	}
	re := registrationError(t, err)
	if re.Partial() || re.Code != -32602 || re.Message != "invalid registration: 4 tools exceed the limit of 3 per device" ||
		len(re.Registered) != 0 || len(re.Rejected) != 0 {
		t.Fatalf("refusal = %+v", re)
	}
	if !strings.Contains(err.Error(), "code -32602") {
		t.Errorf("Error() = %q", err.Error())
	}
	if _, err := f.hub.Device(id); !errors.Is(err, hub.ErrDeviceNotFound) {
		t.Fatalf("a refused device reached the hub: %v", err)
	}
}

// A partial registration connects: Registered returns the rejection, the
// accepted tools work. Re-registrations then report their own outcome
// through Register and Registered: accepted, refused as a whole (the old
// catalog stays), partial again.
func TestSDKRegistrationPartial(t *testing.T) {
	t.Parallel()
	f := startMaxTools(t, 3)
	const id = "02:00:00:00:06:51"
	srv := newServer(t, tools("get_level", longName)...)
	sess := f.connect(t, id, srv, nil)

	re := registrationError(t, sess.Registered())
	if !re.Partial() || re.Code != -32602 || strings.Join(re.Registered, ",") != "get_level" || len(re.Rejected) != 1 ||
		re.Rejected[0] != (device.RejectedTool{Index: 1, Reason: "name longer than 128 bytes"}) ||
		!strings.HasPrefix(re.Message, "1 of 2 tools rejected (1 registered): tools[1]: name longer than 128 bytes") {
		t.Fatalf("partial registration = %+v", re)
	}
	if res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "get_level"}); err != nil || res.IsError {
		t.Fatalf("accepted tool: %+v, %v", res, err)
	}
	catalog := func() string {
		t.Helper()
		_, cat, err := f.hub.Tools(id)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tl := range cat.Tools {
			names = append(names, tl.Name)
		}
		return strings.Join(names, ",")
	}

	// Fixed: all accepted, and Registered forgets the old rejection.
	srv.RemoveTool(longName)
	if err := sess.Register(t.Context()); err != nil {
		t.Fatalf("re-registration: %v", err)
	}
	if err := sess.Registered(); err != nil {
		t.Fatalf("Registered after a clean re-registration: %v", err)
	}

	// Too many: refused as a whole, the session and the catalog stay.
	for _, tl := range tools("b", "c", "d") {
		if err := srv.AddTool(tl); err != nil {
			t.Fatal(err)
		}
	}
	err := sess.Register(t.Context())
	re = registrationError(t, err)
	if re.Partial() || re.Code != -32602 || !strings.Contains(re.Message, "4 tools exceed the limit of 3") {
		t.Fatalf("refused re-registration = %+v", re)
	}
	if got := sess.Registered(); got != err {
		t.Fatalf("Registered = %v, want the last registration's error %v", got, err)
	}
	if got := catalog(); got != "get_level" {
		t.Fatalf("catalog after a refused re-registration = %q, want the previous one", got)
	}
	if res, err := f.hub.Call(t.Context(), hub.CallRequest{Device: id, Tool: "get_level"}); err != nil || res.IsError {
		t.Fatalf("the connection after a refused re-registration: %+v, %v", res, err)
	}

	// Partial again, through Register.
	srv.RemoveTool("d")
	srv.RemoveTool("c")
	if err := srv.AddTool(device.Tool{Name: longName, Handler: ok}); err != nil {
		t.Fatal(err)
	}
	err = sess.Register(t.Context())
	re = registrationError(t, err)
	if !re.Partial() || strings.Join(re.Registered, ",") != "get_level,b" || len(re.Rejected) != 1 || re.Rejected[0].Index != 2 {
		t.Fatalf("partial re-registration = %+v", re)
	}
	if got := catalog(); got != "get_level,b" {
		t.Fatalf("catalog after a partial re-registration = %q", got)
	}
	if got := sess.Registered(); got != err {
		t.Fatalf("Registered = %v, want %v", got, err)
	}
}

// Register on a session of another profile is an error of its own.
func TestSDKRegisterOtherProfile(t *testing.T) {
	t.Parallel()
	f := start(t)
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32})
	if err != nil {
		t.Fatal(err)
	}
	sess := f.connect(t, "02:00:00:00:06:52", srv, nil)
	if err := sess.Register(t.Context()); !errors.Is(err, device.ErrNotRegisterSession) {
		t.Fatalf("Register on an esp32 session: %v", err)
	}
	if err := sess.Registered(); err != nil {
		t.Fatalf("Registered on an esp32 session: %v", err)
	}
}
