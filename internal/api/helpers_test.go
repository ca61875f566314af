package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// testGateway is a real gateway on a random loopback port.
type testGateway struct {
	gw     *gateway.Gateway
	addr   string // host:port
	base   string // http://host:port
	client *api.Client
}

// startGateway runs a gateway until the test ends.
func startGateway(t *testing.T, cfg gateway.Config) *testGateway {
	t.Helper()
	cfg.Version = "test"
	gw, _ := gatewaytest.Start(t, cfg)
	tg := &testGateway{gw: gw, addr: gw.Addr(), base: "http://" + gw.Addr()}
	var err error
	tg.client, err = api.NewClient(tg.base, nil)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return tg
}

// connect connects a fake device and waits until the gateway has its tools.
func (tg *testGateway) connect(t *testing.T, cfg devicetest.Config) *devicetest.Device {
	t.Helper()
	cfg.Addr = tg.addr
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := devicetest.Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("connect device: %v", err)
	}
	t.Cleanup(d.Close)
	tg.waitState(t, d.ID(), hub.StateReady)
	return d
}

// waitState polls the REST API until the device is in state.
func (tg *testGateway) waitState(t *testing.T, ref string, state hub.State) {
	t.Helper()
	checkFor(t, 10*time.Second, func() error {
		d, err := tg.client.Device(t.Context(), ref)
		if err != nil {
			return err
		}
		if d.State != state {
			return errors.New("state is " + string(d.State) + ", want " + string(state))
		}
		return nil
	})
}

// checkFor calls f until it returns nil or the timeout passes.
func checkFor(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %s: %v", timeout, err)
		}
		time.Sleep(wait)
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// do sends a raw request and returns the status and body.
func (tg *testGateway) do(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, tg.base+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// wireError is the error body as it travels, decoded strictly.
type wireError struct {
	Error struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Details json.RawMessage `json:"details"`
	} `json:"error"`
}

// wantError asserts an error response's status and code and returns it.
func (tg *testGateway) wantError(t *testing.T, method, path, body string, status int, code string) wireError {
	t.Helper()
	got, b := tg.do(t, method, path, body)
	var e wireError
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("%s %s: body %s is not an error body: %v", method, path, b, err)
	}
	if got != status || e.Error.Code != code {
		t.Fatalf("%s %s: got %d %q, want %d %q; body %s", method, path, got, e.Error.Code, status, code, b)
	}
	if e.Error.Message == "" {
		t.Errorf("%s %s: error without a message: %s", method, path, b)
	}
	return e
}

// asAPIError asserts err is an *api.APIError with status and code.
func asAPIError(t *testing.T, err error, status int, code string) *api.APIError {
	t.Helper()
	var ae *api.APIError
	if !errors.As(err, &ae) {
		t.Fatalf("error %v (%T) is not an *api.APIError", err, err)
	}
	if ae.Status != status || ae.Code != code {
		t.Fatalf("got %d %q (%v), want %d %q", ae.Status, ae.Code, ae, status, code)
	}
	return ae
}

// compactJSON returns b without insignificant whitespace, for comparisons.
func compactJSON(t *testing.T, b []byte) string {
	t.Helper()
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatalf("not JSON: %s: %v", b, err)
	}
	return buf.String()
}
