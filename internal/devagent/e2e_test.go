//go:build linux

package devagent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/device/packs/ir/irtest"
	"github.com/mcpgate/mcpgate/internal/devagent"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

const waitFor = 15 * time.Second

func newAgent(t *testing.T, fake *irtest.Module, profile device.Profile, id string) *devagent.Agent {
	t.Helper()
	a, err := devagent.New(devagent.Config{
		StateDir: t.TempDir(), ID: id, Packs: []string{"ir", "system"},
		IR: ir.ModuleConfig{Port: fake.Path(), Timeout: time.Second, AckWindow: 200 * time.Millisecond},
	}, profile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// run runs fn until the test ends and waits for it.
func run(t *testing.T, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = fn(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func waitReady(t *testing.T, gw *gateway.Gateway, id string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		d, err := gw.Hub().Device(id)
		if err == nil && d.State == hub.StateReady {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %s: %+v, %v", id, waitFor, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type result struct {
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	IsError bool `json:"isError"`
}

// callREST calls a tool through the gateway's REST API, as an agent does.
func callREST(t *testing.T, gw *gateway.Gateway, id, tool string, args map[string]any) result {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"name": tool, "arguments": args})
	resp, err := http.Post("http://"+gw.Addr()+"/api/v1/devices/"+id+"/tools/call", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var r result
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &r) != nil || len(r.Content) != 1 {
		t.Fatalf("%s: %s %s", tool, resp.Status, b)
	}
	return r
}

func wantText(t *testing.T, r result, isError bool, text string) {
	t.Helper()
	if r.IsError != isError || !strings.Contains(r.Content[0].Text, text) {
		t.Fatalf("result %+v, want isError=%v containing %q", r, isError, text)
	}
}

// TestGatewayIRRoundTrip: a real gateway, the agent on a pseudo-terminal;
// REST calls learn a code, send it by name (exactly its frame on the wire)
// and see the module's failures in the device's own words.
func TestGatewayIRRoundTrip(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	fake := irtest.New(t)
	fake.LearnedCode = []byte{0x26, 0x00, 0x48, 0x00, 0x91, 0x12}
	a := newAgent(t, fake, device.ProfilePyXiaozhi, "02:00:00:00:16:01")
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{Server: "ws://" + gw.Addr() + xiaozhi.Path})
	})
	id := a.ID()
	waitReady(t, gw, id)

	wantText(t, callREST(t, gw, id, "self.ir.learn_external", map[string]any{"name": "tv_power", "timeout_s": 5}), false, `learned "tv_power" (6 bytes)`)
	wantText(t, callREST(t, gw, id, "self.ir.send_named", map[string]any{"name": "tv_power"}), false, `sent "tv_power" (6 bytes); the module confirmed`)
	got := fake.Received()
	want := []byte{0x68, 0x0D, 0x00, 0xFF, 0x22, 0x26, 0x00, 0x48, 0x00, 0x91, 0x12, byte((0xFF + 0x22 + 0x26 + 0x48 + 0x91 + 0x12) % 256), 0x16}
	if len(got) != 2 || !bytes.Equal(got[0], []byte{0x68, 0x07, 0x00, 0xFF, 0x20, 0x1F, 0x16}) || !bytes.Equal(got[1], want) {
		t.Fatalf("wire: % X\nwant learn then % X", got, want)
	}

	wantText(t, callREST(t, gw, id, "self.ir.send_named", map[string]any{"name": "radio"}), true, `no saved IR code named "radio"; saved: tv_power`)
	fake.Next(func(ir.Frame) irtest.Reply {
		return irtest.Reply{Bytes: []byte{0x68, 0x08, 0x00, 0x01, 0x04, 0x00, 0x99, 0x16}}
	})
	wantText(t, callREST(t, gw, id, "self.ir.module_info", nil), true, "the IR module sent a bad reply on "+fake.Path()+": frame checksum is wrong: got 0x99, want 0x05")
	fake.Vanish()
	wantText(t, callREST(t, gw, id, "self.ir.send_hex", map[string]any{"hex": "01"}), true, "(the device vanished: unplugged?); it will be reopened on the next call")
	fake.Reappear()
	wantText(t, callREST(t, gw, id, "self.ir.send_hex", map[string]any{"hex": "01"}), false, "sent 1 bytes")
}

// TestOTAProvisioning: with --ota the agent posts its system information,
// takes the WebSocket URL and device token from the answer, and connects to
// a gateway that requires tokens.
func TestOTAProvisioning(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: bytes.Repeat([]byte("k"), 32)}})
	fake := irtest.New(t)
	a := newAgent(t, fake, device.ProfilePyXiaozhi, "")
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: "http://" + gw.Addr() + ota.Path})
	})
	waitReady(t, gw, a.ID())
	wantText(t, callREST(t, gw, a.ID(), "self.ir.list_codes", nil), false, `{"codes":[]}`)

	// The same without OTA is refused: the token came from the answer.
	b := newAgent(t, fake, device.ProfilePyXiaozhi, "")
	states := make(chan device.State, 16)
	run(t, func(ctx context.Context) error {
		return b.RunGateway(ctx, devagent.GatewayOptions{Server: "ws://" + gw.Addr() + xiaozhi.Path,
			OnState: func(s device.State) {
				select {
				case states <- s:
				default:
				}
			}})
	})
	timeout := time.After(waitFor)
	for {
		select {
		case s := <-states:
			if s.Status != device.StatusDisconnected {
				continue
			}
			if s.Err == nil || !strings.Contains(s.Err.Error(), "refused the device's credentials") {
				t.Fatalf("without a token: %v", s.Err)
			}
			return
		case <-timeout:
			t.Fatal("no connection attempt without a token")
		}
	}
}

// TestOTAProvisionsAgainWhenRefused: a token the gateway refuses (expired,
// revoked; here a forged one in the first OTA answer) makes the agent
// provision again and connect with the fresh one.
func TestOTAProvisionsAgainWhenRefused(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: bytes.Repeat([]byte("k"), 32)}})
	var (
		mu      sync.Mutex
		answers int
	)
	otaProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := proxyOTA(t, w, r, gw)
		if answer == nil {
			return
		}
		mu.Lock()
		answers++
		if answers == 1 {
			answer["websocket"].(map[string]any)["token"] = "forged"
		}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(otaProxy.Close)
	a := newAgent(t, irtest.New(t), device.ProfilePyXiaozhi, "")
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: otaProxy.URL, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	})
	waitReady(t, gw, a.ID())
	mu.Lock()
	defer mu.Unlock()
	if answers != 2 {
		t.Fatalf("%d OTA requests, want 2", answers)
	}
}

// proxyOTA forwards an OTA request to the gateway and returns its decoded
// answer, or nil after answering the error itself.
func proxyOTA(t *testing.T, w http.ResponseWriter, r *http.Request, gw *gateway.Gateway) map[string]any {
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://"+gw.Addr()+ota.Path, r.Body)
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return nil
	}
	defer resp.Body.Close()
	var answer map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return nil
	}
	return answer
}

// TestOTAProvisioningMQTT: an OTA answer with an mqtt section (preferred,
// as firmware prefers it) puts the agent on the gateway's broker, where it
// stays online.
func TestOTAProvisioningMQTT(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{MQTTAddr: "127.0.0.1:0", Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: bytes.Repeat([]byte("k"), 32),
		OTA: ota.Config{Transport: ota.TransportMQTT}}})
	// The gateway's OTA answer names the broker as devices reach it, which
	// a test gateway on random ports cannot know beforehand: a proxy puts
	// the broker's real address in the gateway's own answer.
	otaProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := proxyOTA(t, w, r, gw)
		if answer == nil {
			return
		}
		if m, ok := answer["mqtt"].(map[string]any); ok {
			m["endpoint"] = gw.MQTTAddr()
		}
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(otaProxy.Close)
	fake := irtest.New(t)
	a := newAgent(t, fake, device.ProfilePyXiaozhi, "")
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: otaProxy.URL})
	})
	waitReady(t, gw, a.ID())
	if d, _ := gw.Hub().Device(a.ID()); d.Transport != "mqtt" {
		t.Fatalf("device %+v, want it on MQTT", d)
	}
	wantText(t, callREST(t, gw, a.ID(), "self.ir.send_hex", map[string]any{"hex": "C0FFEE"}), false, "sent 3 bytes")
	if got := fake.Received(); len(got) != 1 || !bytes.Equal(got[0], irtest.Frame(0xFF, ir.AFNCode, 0xC0, 0xFF, 0xEE)) {
		t.Fatalf("wire % X", got)
	}
}

// TestReconnectAfterGatewayRestart: the agent comes back by itself when the
// gateway restarts on the same address.
func TestReconnectAfterGatewayRestart(t *testing.T) {
	dir := t.TempDir()
	gw, stop := gatewaytest.Start(t, gateway.Config{DataDir: dir})
	addr := gw.Addr()
	fake := irtest.New(t)
	a := newAgent(t, fake, device.ProfilePyXiaozhi, "")
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{Server: "ws://" + addr + xiaozhi.Path,
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	})
	waitReady(t, gw, a.ID())
	stop()
	gw2, _ := gatewaytest.Start(t, gateway.Config{Addr: addr, DataDir: dir})
	waitReady(t, gw2, a.ID())
	wantText(t, callREST(t, gw2, a.ID(), "self.ir.send_hex", map[string]any{"hex": "AA BB"}), false, "sent 2 bytes")
}

// TestEndpointMode: the agent dials mcpgate's /mcp/endpoint and its tools
// become a source the REST API calls.
func TestEndpointMode(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{EndpointTokens: []string{"s3cret"}})
	fake := irtest.New(t)
	a := newAgent(t, fake, device.ProfileSpec, "")
	run(t, func(ctx context.Context) error {
		return a.RunEndpoint(ctx, devagent.EndpointOptions{URL: "ws://" + gw.Addr() + "/mcp/endpoint?token=s3cret&name=livingroom"})
	})
	waitReady(t, gw, "endpoint-livingroom")
	wantText(t, callREST(t, gw, "endpoint-livingroom", "self.ir.send_hex", map[string]any{"hex": "0102"}), false, "sent 2 bytes")
	if got := fake.Received(); len(got) != 1 || !bytes.Equal(got[0], irtest.Frame(0xFF, ir.AFNCode, 1, 2)) {
		t.Fatalf("wire % X", got)
	}
	wantText(t, callREST(t, gw, "endpoint-livingroom", "self.ir.send_named", map[string]any{"name": "x"}), true, `no saved IR code named "x"`)
}

// TestStdioWithMCPClient: the stdio mode is a standard MCP server the
// go-sdk client drives.
func TestStdioWithMCPClient(t *testing.T) {
	fake := irtest.New(t)
	a := newAgent(t, fake, device.ProfileSpec, "")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- a.ServeStdio(t.Context(), inR, outW); outW.Close() }()

	client := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if len(names) != 10 || names[0] != "self.ir.list_codes" || names[9] != "self.audio_speaker.set_volume" {
		t.Fatalf("tools %v", names)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "self.ir.send_hex", Arguments: map[string]any{"hex": "FE"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "sent 1 bytes; the module confirmed" {
		t.Fatalf("send_hex = %+v, %v", res, err)
	}
	res, err = cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "self.ir.send_internal", Arguments: map[string]any{"index": 8}})
	if err != nil || !res.IsError || res.Content[0].(*mcp.TextContent).Text != "Value exceeds maximum allowed: 6" {
		t.Fatalf("send_internal(8) = %+v, %v", res, err)
	}
	cs.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeStdio: %v", err)
		}
	case <-time.After(waitFor):
		t.Fatal("ServeStdio did not return after stdin closed")
	}
}

// TestEndpointTokenStaysOutOfLogs: failed dials are retried and logged
// without the token in the URL, whether the gateway refuses it or is down
// (net/http's errors repeat the URL).
func TestEndpointTokenStaysOutOfLogs(t *testing.T) {
	gw, stop := gatewaytest.Start(t, gateway.Config{EndpointTokens: []string{"s3cret"}})
	var logs syncBuffer
	a := infoAgent(t, &logs, device.ProfileSpec)
	run(t, func(ctx context.Context) error {
		return a.RunEndpoint(ctx, devagent.EndpointOptions{URL: "ws://" + gw.Addr() + "/mcp/endpoint?token=wrong-token",
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	})
	waitLogged(t, &logs, "refused the token in --url: 401 Unauthorized")
	stop()
	waitLogged(t, &logs, "REDACTED")
	if out := logs.String(); strings.Contains(out, "wrong-token") {
		t.Fatalf("the token is in the logs:\n%s", out)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRefusedTokenSaidOnce: an OTA answer whose token the gateway keeps
// refusing is said once at warn, by the agent, then at debug until a
// minute has passed, however often the agent provisions again.
func TestRefusedTokenSaidOnce(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: bytes.Repeat([]byte("k"), 32)}})
	var mu sync.Mutex
	posts := 0
	otaProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := proxyOTA(t, w, r, gw)
		if answer == nil {
			return
		}
		answer["websocket"].(map[string]any)["token"] = "mgd1.bogus"
		mu.Lock()
		posts++
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(otaProxy.Close)
	var logs syncBuffer
	a := infoAgent(t, &logs, device.ProfilePyXiaozhi)
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: otaProxy.URL, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := posts
		mu.Unlock()
		if n >= 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d OTA requests in 10 s, want 6", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 || !strings.Contains(out, `level=WARN msg="the gateway refused the provisioned credentials; provisioning again"`) {
		t.Errorf("%d warnings over 6 refusals, want the first refusal said once, by the agent (the client's \"retrying\" announces a retry that never comes):\n%s", n, out)
	}
	if n := strings.Count(out, "msg=provisioned"); n != 1 {
		t.Errorf("provisioned said %d times at info, want once:\n%s", n, out)
	}
}

// TestClonedIDSaidOnce: two agents with one device id (a cloned SD card)
// replace each other on the gateway; each replacement is one warning,
// the agent's, which names the device-id file (the device SDK's own
// warning made it two).
func TestClonedIDSaidOnce(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	const id = "02:00:00:00:16:0c"
	logs := make([]*syncBuffer, 2)
	for i := range logs {
		logs[i] = &syncBuffer{}
		a, err := devagent.New(devagent.Config{StateDir: t.TempDir(), ID: id, Packs: []string{"system"},
			Logger: slog.New(slog.NewTextHandler(logs[i], nil))}, device.ProfilePyXiaozhi)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		run(t, func(ctx context.Context) error {
			return a.RunGateway(ctx, devagent.GatewayOptions{Server: "ws://" + gw.Addr() + xiaozhi.Path,
				MinBackoff: 50 * time.Millisecond, MaxBackoff: 300 * time.Millisecond})
		})
		if i == 0 {
			waitLogged(t, logs[0], "msg=connected")
		}
	}
	// The first is replaced by the second, then the second by the first.
	for _, l := range logs {
		waitLogged(t, l, "another device uses this device id")
	}
	for i, l := range logs {
		out := l.String()
		said := strings.Count(out, "another device uses this device id")
		if n := strings.Count(out, "level=WARN"); n != said || !strings.Contains(out, "device_id_file=") {
			t.Errorf("agent %d: %d warnings for %d replacements, want one each, naming the file:\n%s", i, n, said, out)
		}
	}
}

// TestEndpointSessionEndIsNoWarning: a session that ends (the gateway
// restarting) is said at info, and so is the first failed attempt after
// it; a refused token is a warning at once.
func TestEndpointSessionEndIsNoWarning(t *testing.T) {
	gw, stop := gatewaytest.Start(t, gateway.Config{EndpointTokens: []string{"s3cret"}})
	var logs syncBuffer
	a := infoAgent(t, &logs, device.ProfileSpec)
	run(t, func(ctx context.Context) error {
		return a.RunEndpoint(ctx, devagent.EndpointOptions{URL: "ws://" + gw.Addr() + "/mcp/endpoint?token=s3cret",
			MinBackoff: time.Second, MaxBackoff: time.Second})
	})
	waitLogged(t, &logs, "connected to the MCP endpoint")
	stop()
	waitLogged(t, &logs, "cannot connect to the endpoint")
	if out := logs.String(); strings.Contains(out, "level=WARN") || !strings.Contains(out, "endpoint connection ended") {
		t.Errorf("a gateway restart logged a warning, or not the end:\n%s", out)
	}
}

// waitLogged waits until logs hold text.
func waitLogged(t *testing.T, logs *syncBuffer, text string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(logs.String(), text) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q logged:\n%s", text, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// infoAgent is an agent with the system pack logging to logs at info, the
// level it runs at by default.
func infoAgent(t *testing.T, logs io.Writer, profile device.Profile) *devagent.Agent {
	t.Helper()
	a, err := devagent.New(devagent.Config{StateDir: t.TempDir(), Packs: []string{"system"},
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, profile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// TestRefusalThenHealthySessionWarns: once a device refused a token
// connects with a fresh one, its session's failures show at warn again;
// the streak of refusals no longer quiets them.
func TestRefusalThenHealthySessionWarns(t *testing.T) {
	gw, stop := gatewaytest.Start(t, gateway.Config{Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: bytes.Repeat([]byte("k"), 32)}})
	addr := gw.Addr()
	var (
		mu      sync.Mutex
		answers int
	)
	otaProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := proxyOTA(t, w, r, gw)
		if answer == nil {
			return
		}
		mu.Lock()
		if answers++; answers == 1 {
			answer["websocket"].(map[string]any)["token"] = "mgd1.bogus"
		}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(otaProxy.Close)
	var logs syncBuffer
	a := infoAgent(t, &logs, device.ProfilePyXiaozhi)
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: otaProxy.URL, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	})
	waitReady(t, gw, a.ID())
	// The gateway goes away (the first failure is info), then something
	// else answers on its address: the reason changes, which is a warning.
	stop()
	waitLogged(t, &logs, "connection refused")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on the gateway's address again: %v", err)
	}
	other := httptest.NewUnstartedServer(http.NotFoundHandler())
	other.Listener.Close()
	other.Listener = ln
	other.Start()
	t.Cleanup(other.Close)
	deadline := time.Now().Add(waitFor)
	for !regexp.MustCompile(`level=WARN msg="cannot connect; retrying".*404`).MatchString(logs.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no warning that the gateway cannot be reached:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
