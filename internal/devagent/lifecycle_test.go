package devagent_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/devagent"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
)

// plainAgent is an agent with the system pack and a test tool that waits
// d unless its ctx ends first, reporting which on ended.
func plainAgent(t *testing.T, logs io.Writer, profile device.Profile, d time.Duration) (*devagent.Agent, chan string) {
	t.Helper()
	if logs == nil {
		logs = io.Discard
	}
	a, err := devagent.New(devagent.Config{StateDir: t.TempDir(), Packs: []string{"system"},
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}, profile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	ended := make(chan string, 4)
	err = a.Server().AddTool(device.Tool{Name: "self.test.wait", Handler: func(ctx context.Context, _ device.Args) (any, error) {
		select {
		case <-time.After(d):
			ended <- "done"
			return "done", nil
		case <-ctx.Done():
			ended <- "cancelled"
			return nil, ctx.Err()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return a, ended
}

// stdio runs ServeStdio on pipes and returns its input and a line reader.
func stdio(t *testing.T, a *devagent.Agent) (in *io.PipeWriter, lines chan string, done chan error) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done = make(chan error, 1)
	go func() { done <- a.ServeStdio(t.Context(), inR, outW); outW.Close() }()
	lines = make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { inW.Close(); inR.Close(); outR.Close() })
	return inW, lines, done
}

func nextLine(t *testing.T, lines chan string) string {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatal("output ended")
		}
		return l
	case <-time.After(waitFor):
		t.Fatal("no output")
		return ""
	}
}

// TestStdioCancelledCall: notifications/cancelled stops the call, which
// gets no reply.
func TestStdioCancelledCall(t *testing.T) {
	a, ended := plainAgent(t, nil, device.ProfileSpec, time.Minute)
	in, lines, _ := stdio(t, a)
	io.WriteString(in, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"self.test.wait"}}`+"\n")
	time.Sleep(50 * time.Millisecond)
	io.WriteString(in, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"timeout"}}`+"\n")
	select {
	case how := <-ended:
		if how != "cancelled" {
			t.Fatal(how)
		}
	case <-time.After(waitFor):
		t.Fatal("the call was not cancelled")
	}
	io.WriteString(in, `{"jsonrpc":"2.0","id":6,"method":"ping"}`+"\n")
	if l := nextLine(t, lines); !strings.Contains(l, `"id":6`) {
		t.Fatalf("got %s, want the ping's reply and none for the cancelled call", l)
	}
}

// TestStdioEOFWaitsForCalls: closing stdin lets running calls answer.
func TestStdioEOFWaitsForCalls(t *testing.T) {
	a, _ := plainAgent(t, nil, device.ProfileSpec, 300*time.Millisecond)
	in, lines, done := stdio(t, a)
	io.WriteString(in, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.test.wait"}}`+"\n")
	in.Close()
	if l := nextLine(t, lines); !strings.Contains(l, `"text":"done"`) {
		t.Fatalf("got %s, want the call's result", l)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestStdioTooLongMessage: a message over the limit is answered with an
// error and skipped; the server keeps serving.
func TestStdioTooLongMessage(t *testing.T) {
	a, _ := plainAgent(t, nil, device.ProfileSpec, 0)
	in, lines, done := stdio(t, a)
	go func() {
		io.WriteString(in, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"a":"`+strings.Repeat("x", 4<<20)+`"}}}`+"\n")
		io.WriteString(in, `{"jsonrpc":"2.0","id":2,"method":"ping"}`+"\n")
	}()
	if l := nextLine(t, lines); !strings.Contains(l, `"id":null`) || !strings.Contains(l, "-32600") || !strings.Contains(l, "4194304") {
		t.Fatalf("got %s, want an error naming the limit", l)
	}
	if l := nextLine(t, lines); !strings.Contains(l, `"id":2`) {
		t.Fatalf("got %s, want the ping's reply", l)
	}
	in.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestEndpointRefusalSaysWhy: a refused endpoint token is reported with
// the endpoint's reason, without the token.
func TestEndpointRefusalSaysWhy(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "endpoint token unknown: "+r.URL.Query().Get("token"), http.StatusUnauthorized)
	}))
	t.Cleanup(refuse.Close)
	var logs syncBuffer
	a, _ := plainAgent(t, &logs, device.ProfileSpec, 0)
	run(t, func(ctx context.Context) error {
		return a.RunEndpoint(ctx, devagent.EndpointOptions{URL: "ws" + strings.TrimPrefix(refuse.URL, "http") + `/mcp?token=se"cret-value`,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	})
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(logs.String(), "refused the token") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out := logs.String(); !strings.Contains(out, "401 Unauthorized: endpoint token unknown") || strings.Contains(out, "cret-value") {
		t.Fatalf("logs:\n%s", out)
	}
}

// TestEndpointStopSendsCloseFrame: stopping the agent closes the endpoint
// connection with going-away, not by dropping it.
func TestEndpointStopSendsCloseFrame(t *testing.T) {
	ended := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			if _, _, err := c.Read(r.Context()); err != nil {
				ended <- err
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	a, _ := plainAgent(t, nil, device.ProfileSpec, 0)
	connected := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- a.RunEndpoint(ctx, devagent.EndpointOptions{URL: "ws" + strings.TrimPrefix(srv.URL, "http") + "/mcp",
			OnConnect: func() { connected <- struct{}{} }})
	}()
	<-connected
	cancel()
	<-done
	select {
	case err := <-ended:
		if websocket.CloseStatus(err) != websocket.StatusGoingAway {
			t.Fatalf("endpoint read ended with %v, want a going-away close frame", err)
		}
	case <-time.After(waitFor):
		t.Fatal("the endpoint's read did not end")
	}
}

// TestOTARefusedTokenBacksOff: a token the gateway always refuses makes
// the agent provision again with a growing wait, not in a tight loop.
func TestOTARefusedTokenBacksOff(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Provisioning: gateway.Provisioning{
		DeviceAuth: devauth.ModeToken, DeviceSecret: bytes.Repeat([]byte("k"), 32)}})
	var posts atomic.Int32
	otaProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := proxyOTA(t, w, r, gw)
		if answer == nil {
			return
		}
		posts.Add(1)
		answer["websocket"].(map[string]any)["token"] = "forged"
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(otaProxy.Close)
	a, _ := plainAgent(t, nil, device.ProfilePyXiaozhi, 0)
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: otaProxy.URL, MinBackoff: 20 * time.Millisecond, MaxBackoff: 400 * time.Millisecond})
	})
	time.Sleep(2 * time.Second)
	// Waits of about 20, 40, 80, 160, 320, 400... ms: under 12 in 2 s,
	// where resetting after each answer made dozens.
	if n := posts.Load(); n < 3 || n > 12 {
		t.Fatalf("%d OTA requests in 2s", n)
	}
}

// TestOTAProvisionsAgainWhenUnreachable: an endpoint from the OTA answer
// that stays unreachable makes the agent provision again.
func TestOTAProvisionsAgainWhenUnreachable(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	deadURL := "ws://" + freeport.Refused + "/xiaozhi/v1/"
	var (
		mu    sync.Mutex
		posts int
	)
	otaProxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer := proxyOTA(t, w, r, gw)
		if answer == nil {
			return
		}
		mu.Lock()
		if posts++; posts == 1 {
			answer["websocket"].(map[string]any)["url"] = deadURL // the public URL changed since
		}
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(otaProxy.Close)
	a, _ := plainAgent(t, nil, device.ProfilePyXiaozhi, 0)
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: otaProxy.URL, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
			ReprovisionAfter: 200 * time.Millisecond, ReprovisionAttempts: 3})
	})
	waitReady(t, gw, a.ID())
	mu.Lock()
	defer mu.Unlock()
	if posts != 2 {
		t.Fatalf("%d OTA requests, want 2", posts)
	}
}

// TestEndpointQuotedTokenStaysOutOfLogs: a token that %q escapes (a quote
// in it) is hidden from dial errors too.
func TestEndpointQuotedTokenStaysOutOfLogs(t *testing.T) {
	url := "ws://" + freeport.Refused + `/mcp?token=se"cret-value`
	var logs syncBuffer
	a, _ := plainAgent(t, &logs, device.ProfileSpec, 0)
	run(t, func(ctx context.Context) error {
		return a.RunEndpoint(ctx, devagent.EndpointOptions{URL: url, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	})
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(logs.String(), "connection refused") {
		if time.Now().After(deadline) {
			t.Fatalf("no dial failure logged:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if out := logs.String(); strings.Contains(out, "cret-value") {
		t.Fatalf("the token is in the logs:\n%s", out)
	}
}

// TestDefaultName: an agent's serverInfo name comes from its device id, so
// an endpoint names each unnamed board the same whichever connects first.
func TestDefaultName(t *testing.T) {
	for id, want := range map[string]string{
		"02:5A:1B:2C:3D:4E": "mcpgate-device-2c3d4e",
		"001122334455":      "mcpgate-device-334455",
		"ab":                "mcpgate-device-ab",
		"::":                "mcpgate-device",
	} {
		if got := devagent.DefaultName(id); got != want {
			t.Errorf("DefaultName(%q) = %q, want %q", id, got, want)
		}
	}
}

// TestOTAErrorPageBoundedAndRedacted: an OTA endpoint that fails with a
// large error page echoing the request URL is quoted in the log lines
// (warn, then debug for the attempts between) by a bounded excerpt, without
// the URL's token.
func TestOTAErrorPageBoundedAndRedacted(t *testing.T) {
	const token = "ota-s3cret-token"
	ota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "Cannot POST %s\n%s", r.URL.RequestURI(), strings.Repeat("padding ", 64<<10))
	}))
	t.Cleanup(ota.Close)
	var logs syncBuffer
	a, _ := plainAgent(t, &logs, device.ProfilePyXiaozhi, 0)
	run(t, func(ctx context.Context) error {
		return a.RunGateway(ctx, devagent.GatewayOptions{OTA: ota.URL + "/xiaozhi/ota/?token=" + token,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	})
	deadline := time.Now().Add(waitFor)
	for strings.Count(logs.String(), "OTA provisioning failed") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the OTA failure was not logged 3 times:\n%.4000s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := logs.String()
	if strings.Contains(out, token) || !strings.Contains(out, "404 Not Found: Cannot POST /xiaozhi/ota/?REDACTED") {
		t.Errorf("the token is in the logs, or the error page is not quoted:\n%.4000s", out)
	}
	for line := range strings.Lines(out) {
		if len(line) > 1000 {
			t.Fatalf("a log line of %d bytes: %.300s...", len(line), line)
		}
	}
}

// TestReadOnlyWritesNothing: a read-only agent makes no state dir and keeps
// no identity it made up, and uses one already kept.
func TestReadOnlyWritesNothing(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	a, err := devagent.New(devagent.Config{StateDir: state, Packs: []string{"system"}, ReadOnly: true}, device.ProfileSpec)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Fatalf("a read-only agent made %s (%v)", state, err)
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "device-id"), []byte("02:00:00:00:00:07\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err = devagent.New(devagent.Config{StateDir: state, Packs: []string{"system"}, ReadOnly: true}, device.ProfileSpec)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	if a.ID() != "02:00:00:00:00:07" {
		t.Errorf("ID %s, want the kept one", a.ID())
	}
	if entries, _ := os.ReadDir(state); len(entries) != 1 {
		t.Errorf("state dir holds %d files, want the device-id alone", len(entries))
	}
}
