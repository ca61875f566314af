package ws_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// answers collects the gateway's answers to a fake device's own requests.
type answers struct {
	mu   sync.Mutex
	byID map[string]string // request id -> the answer's payload
}

func (a *answers) onFrame(typ websocket.MessageType, data []byte) {
	var env struct {
		Payload json.RawMessage `json:"payload"`
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	if typ != websocket.MessageText || json.Unmarshal(data, &env) != nil || json.Unmarshal(env.Payload, &msg) != nil ||
		msg.Method != "" || len(msg.ID) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.byID[string(msg.ID)] = string(env.Payload)
}

func (a *answers) get(id string) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.byID[id]
	return s, ok
}

func (a *answers) len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byID)
}

// A XiaoZhi device's own requests get answers, as MCP requires of ping and
// as the registration dialect answers the rest.
func TestDeviceRequestsAnswered(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	for i, tc := range []struct {
		method, id, want string
	}{
		{"ping", "1", `{"jsonrpc":"2.0","id":1,"result":{}}`},
		{"roots/list", `"r"`, `{"jsonrpc":"2.0","id":"r","error":{"code":-32601,"message":"Method not found: roots/list"}}`},
		{"sampling/createMessage", "0", `{"jsonrpc":"2.0","id":0,"error":{"code":-32601,"message":"Method not found: sampling/createMessage"}}`},
	} {
		t.Run(tc.method, func(t *testing.T) {
			t.Parallel()
			a := &answers{byID: map[string]string{}}
			d := connectReady(t, s, devicetest.Config{ID: fmt.Sprintf("02:00:00:00:d1:%02x", i), OnFrame: a.onFrame})
			send(t, d, websocket.MessageText, fmt.Appendf(nil,
				`{"session_id":%q,"type":"mcp","payload":{"jsonrpc":"2.0","id":%s,"method":%q,"params":{}}}`, d.SessionID(), tc.id, tc.method))
			checkFor(t, "the answer to "+tc.method, func() bool { _, ok := a.get(tc.id); return ok })
			if got, _ := a.get(tc.id); got != tc.want {
				t.Errorf("answer %s\nwant   %s", got, tc.want)
			}
		})
	}
}

// A device flooding requests has each one answered or dropped and counted,
// never queued without bound, and stays served.
func TestDeviceRequestFlood(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	a := &answers{byID: map[string]string{}}
	id := "02:00:00:00:d2:01"
	d := connectReady(t, s, devicetest.Config{ID: id, OnFrame: a.onFrame})
	drops0 := metric(t, s, `mcpgate_dropped_frames_total{reason="device_request"}`)
	const n = 2000
	for i := range n {
		send(t, d, websocket.MessageText, fmt.Appendf(nil,
			`{"session_id":%q,"type":"mcp","payload":{"jsonrpc":"2.0","id":%d,"method":"ping"}}`, d.SessionID(), 1000+i))
	}
	checkFor(t, "every request answered or dropped", func() bool {
		return float64(a.len())+metric(t, s, `mcpgate_dropped_frames_total{reason="device_request"}`)-drops0 == n
	})
	mustCall(t, s.hub, id)
	if lines := strings.Count(s.logs.String(), "dropped requests from device"); float64(lines) > metric(t, s, `mcpgate_dropped_frames_total{reason="device_request"}`)-drops0 {
		t.Errorf("%d log lines for the dropped requests, more than dropped", lines)
	}
}

// The XiaoZhi dialect skips a tool whose name holds control characters, as
// the registration dialect rejects it, and says which device and tool.
func TestToolNameWithControlCharacters(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	id := "02:00:00:00:d3:01"
	connectReady(t, s, devicetest.Config{ID: id, Tools: []json.RawMessage{
		json.RawMessage(`{"name":"lamp\non","description":"d","inputSchema":{"type":"object","properties":{}}}`),
		json.RawMessage(devicetest.SetVolumeTool),
	}})
	_, cat, err := s.hub.Tools(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cat.Tool("lamp\non"); ok || cat.Len() != 1 {
		t.Errorf("catalog has %d tools, the one named lamp\\non among them: %v", cat.Len(), ok)
	}
	for _, line := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(line, "skipped malformed tool") && strings.Contains(line, "device_id="+id) &&
			strings.Contains(line, `\"lamp\\non\" contains control characters`) {
			return
		}
	}
	t.Errorf("no warning naming the device and quoting the tool:\n%s", s.logs.String())
}

// mcp/registerTools sent without an id is refused with a reason that says
// the id is missing.
func TestRegisterToolsWithoutID(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	for _, frame := range []string{
		`{"jsonrpc":"2.0","method":"mcp/registerTools","params":{"mac_addr":"02:00:00:00:d4:01","tools":[]}}`,
		`{"method":"mcp/registerTools","jsonrpc":"2.0","params":{"mac_addr":"02:00:00:00:d4:01","tools":[{"name":"x"}]}}`,
	} {
		c := dial(t, s, "02:00:00:00:d4:01")
		writeText(t, c, frame)
		ce := readClose(t, c)
		if ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, "mcp/registerTools without an id") {
			t.Errorf("%s: closed with %d %q, want 1008 naming the missing id", frame, ce.Code, ce.Reason)
		}
	}
}

// A result {"isError":true} without content is the device's failure, not
// free JSON to report as a success.
func TestIsErrorWithoutContent(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	for i, tc := range []struct {
		result, text string
	}{
		{`{"isError":true}`, "device reported an error without content"},
		{`{"isError":true,"reason":"jammed"}`, `device reported an error: {"isError":true,"reason":"jammed"}`},
	} {
		id := fmt.Sprintf("02:00:00:00:d5:%02x", i)
		connectReady(t, s, devicetest.Config{ID: id, OnCall: func(devicetest.Call) devicetest.Answer {
			return devicetest.Answer{Result: json.RawMessage(tc.result)}
		}})
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		res, err := s.hub.Call(ctx, hub.CallRequest{Device: id, Tool: volumeTool, Arguments: json.RawMessage(`{"volume":1}`)})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError || res.Text() != tc.text {
			t.Errorf("%s: IsError=%v text=%q, want a failure %q", tc.result, res.IsError, res.Text(), tc.text)
		}
	}
}

// An initialize reply with a malformed serverInfo is read leniently: the
// device initialized, and what it said well is kept.
func TestInitializeMalformedServerInfo(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	for i, tc := range []struct {
		serverInfo string
		want       string // the server_info kept, "" for none
	}{
		{`"weird"`, ""},
		{`{"name":123,"version":"2.4.2"}`, "2.4.2"},
	} {
		id := fmt.Sprintf("02:00:00:00:d6:%02x", i)
		scripted(t, s, id, func(method string, _ json.RawMessage) string {
			switch method {
			case "initialize":
				return `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":` + tc.serverInfo + `}`
			case "tools/list":
				return `{"tools":[` + devicetest.SetVolumeTool + `]}`
			}
			return ""
		})
		d := waitState(t, s.hub, id, hub.StateReady)
		if d.LastError != "" {
			t.Errorf("serverInfo %s: last error %q, want none", tc.serverInfo, d.LastError)
		}
		if got := ""; d.ServerInfo != nil {
			got = d.ServerInfo.Version
			if got != tc.want {
				t.Errorf("serverInfo %s: kept %+v, want version %q", tc.serverInfo, *d.ServerInfo, tc.want)
			}
		} else if tc.want != "" {
			t.Errorf("serverInfo %s: none kept, want version %q", tc.serverInfo, tc.want)
		}
	}
	if strings.Contains(s.logs.String(), "initialize failed") {
		t.Errorf("initialize reported as failed:\n%s", s.logs.String())
	}
}
