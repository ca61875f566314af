package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The MCP phase calls the same tool as the REST phases, through the
// gateway's aggregate MCP server on /mcp (Streamable HTTP), where it is
// named "<alias>.<tool>". Each worker holds one MCP session on one
// keep-alive connection, made with the raw HTTP client: initialize and
// notifications/initialized once, then tools/call back to back.

// mcpPath is the aggregate MCP server's endpoint.
const mcpPath = "/mcp"

// mcpOpenTimeout bounds opening the MCP phase's sessions. A gateway that
// cannot open them in this time has a problem the phase reports, rather
// than measuring nothing.
const mcpOpenTimeout = 30 * time.Second

// mcpProtocolVersion is the protocol version the bench asks for: the newest
// one a stateful Streamable HTTP server (the gateway's) accepts.
const mcpProtocolVersion = "2025-11-25"

// Outcomes of an MCP call besides the REST ones.
const (
	// outcomeSession: initialize or notifications/initialized failed, so
	// no call could be made.
	outcomeSession = "mcp_session"
	// outcomeNoResponse: a 200 whose body held no JSON-RPC response to the
	// call (an SSE stream without one, or an unreadable body).
	outcomeNoResponse = "no_response"
)

// mcpLoad is what the MCP phase needs: the gateway, the tool name of each
// device on /mcp, and the arguments.
type mcpLoad struct {
	addr  string   // host:port
	auth  []byte   // authLine of the API key; nil for none
	names [][]byte // per device: the JSON string "<alias>.<tool>"
	conns int
	args  json.RawMessage // nil: {"volume":N}, N varying per call

	mu     sync.Mutex
	opened []*mcpCaller // guarded by mu; sessions open already, handed out by worker
}

func newMCPLoad(base, key string, aliases []string, conns int, tool string, args json.RawMessage) *mcpLoad {
	m := &mcpLoad{addr: strings.TrimPrefix(base, "http://"), auth: authLine(key), conns: conns, args: args}
	for _, a := range aliases {
		name, _ := json.Marshal(a + "." + tool) // a string always marshals
		m.names = append(m.names, name)
	}
	return m
}

func (m *mcpLoad) workers() int { return m.conns }
func (m *mcpLoad) devices() int { return len(m.names) }

// worker returns a session opened by open, or a new one (opened on its
// first call) when none is left.
func (m *mcpLoad) worker() devCaller {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := len(m.opened); n > 0 {
		c := m.opened[n-1]
		m.opened = m.opened[:n-1]
		return c
	}
	return &mcpCaller{load: m, raw: &rawCaller{addr: m.addr, auth: m.auth}}
}

// open opens every worker's MCP session at once, before the loop, within
// timeout, and reports how long that took. The first request on /mcp may
// be slow (the gateway builds the aggregate's tool list), and a session
// that cannot open would leave the loop with neither calls nor errors; an
// error here says which and why, and nothing is left open.
func (m *mcpLoad) open(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	callers := make([]*mcpCaller, m.conns)
	errs := make([]error, m.conns)
	var wg sync.WaitGroup
	for i := range callers {
		callers[i] = &mcpCaller{load: m, raw: &rawCaller{addr: m.addr, auth: m.auth}}
		wg.Go(func() { errs[i] = callers[i].initialize(ctx) })
	}
	wg.Wait()
	took := time.Since(start)
	failed, first := 0, error(nil)
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if failed > 0 {
		for _, c := range callers {
			c.close()
		}
		if ctx.Err() != nil {
			first = fmt.Errorf("no answer within %s (%w)", timeout, first)
		}
		return took, fmt.Errorf("%d of %d MCP sessions could not be opened on %s: %w", failed, m.conns, mcpPath, first)
	}
	m.mu.Lock()
	m.opened = callers
	m.mu.Unlock()
	return took, nil
}

// mcpCaller is one worker's MCP session.
type mcpCaller struct {
	load *mcpLoad
	raw  *rawCaller
	// hdr is the session's request headers: Accept, Mcp-Session-Id and
	// Mcp-Protocol-Version; nil until initialized.
	hdr  []byte
	body []byte // request, reused
	id   int64  // JSON-RPC id of the last request
}

func (c *mcpCaller) close() { c.raw.close() }

// initialize opens the MCP session: initialize, then notifications/initialized.
func (c *mcpCaller) initialize(ctx context.Context) error {
	accept := []byte("Accept: application/json, text/event-stream\r\n")
	c.raw.session = ""
	c.id++
	body := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%d,"method":"initialize","params":{"protocolVersion":%q,"capabilities":{},"clientInfo":{"name":"mcpgate-bench","version":"1"}}}`,
		c.id, mcpProtocolVersion)
	status, err := c.raw.post(ctx, mcpPath, accept, body)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("initialize: HTTP %d: %s", status, truncate(c.raw.body, 200))
	}
	var res struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := rpcResponse(c.raw.body, c.id, &res); err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	if c.raw.session == "" {
		return errors.New("initialize: no Mcp-Session-Id in the answer")
	}
	hdr := append(accept, "Mcp-Session-Id: "...)
	hdr = append(hdr, c.raw.session...)
	hdr = append(hdr, "\r\nMcp-Protocol-Version: "...)
	hdr = append(hdr, res.ProtocolVersion...)
	hdr = append(hdr, "\r\n"...)
	status, err = c.raw.post(ctx, mcpPath, hdr, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	if err != nil {
		return err
	}
	if status != http.StatusAccepted && status != http.StatusOK && status != http.StatusNoContent {
		return fmt.Errorf("notifications/initialized: HTTP %d: %s", status, truncate(c.raw.body, 200))
	}
	c.hdr = hdr
	return nil
}

func (c *mcpCaller) call(ctx context.Context, dev, seq int) (string, error) {
	if c.hdr == nil {
		if err := c.initialize(ctx); err != nil {
			return outcomeSession, err
		}
	}
	c.id++
	b := append(c.body[:0], `{"jsonrpc":"2.0","id":`...)
	b = strconv.AppendInt(b, c.id, 10)
	b = append(b, `,"method":"tools/call","params":{"name":`...)
	b = append(b, c.load.names[dev]...)
	b = append(b, `,"arguments":`...)
	b = appendArgs(b, c.load.args, seq)
	b = append(b, "}}"...)
	c.body = b
	status, err := c.raw.post(ctx, mcpPath, c.hdr, b)
	if err != nil {
		return outcomeTransport, err
	}
	if status != http.StatusOK {
		if status == http.StatusNotFound {
			c.hdr = nil // the session is gone: open a new one on the next call
		}
		return "http_" + strconv.Itoa(status), fmt.Errorf("HTTP %d: %s", status, truncate(c.raw.body, 200))
	}
	var res struct {
		IsError bool `json:"isError"`
		Meta    struct {
			Code string `json:"mcpgate/error"`
		} `json:"_meta"`
	}
	if err := rpcResponse(c.raw.body, c.id, &res); err != nil {
		var re *rpcError
		if errors.As(err, &re) {
			return "jsonrpc_" + strconv.Itoa(re.Code), err
		}
		return outcomeNoResponse, err
	}
	if res.IsError {
		// A gateway failure carries its code; a device's own failure does not.
		code := res.Meta.Code
		if code == "" {
			code = outcomeToolError
		}
		return code, fmt.Errorf("isError result: %s", truncate(c.raw.body, 200))
	}
	return outcomeOK, nil
}

// appendArgs appends a call's arguments: args, or {"volume":N} with N
// changing on every call so that no layer can answer from a cache.
func appendArgs(b []byte, args json.RawMessage, seq int) []byte {
	if args != nil {
		return append(b, args...)
	}
	b = append(b, `{"volume":`...)
	b = strconv.AppendInt(b, int64(seq%101), 10)
	return append(b, '}')
}

// rpcError is a JSON-RPC error response.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return fmt.Sprintf("JSON-RPC error %d: %s", e.Code, e.Message) }

// rpcResponse finds the JSON-RPC response with the given id in body, a
// JSON body or an SSE stream whose data lines carry messages (a server may
// send notifications before the response), and decodes its result into
// result.
func rpcResponse(body []byte, id int64, result any) error {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && body[0] == '{' {
		return decodeResponse(body, id, result)
	}
	// SSE: events separated by blank lines, each "data:" line a piece of
	// the event's data. The gateway writes one line per message; join
	// multi-line data as the spec says all the same.
	var data []byte
	var last error = errors.New("no JSON-RPC response in the body")
	flush := func() bool {
		if len(data) == 0 {
			return false
		}
		err := decodeResponse(data, id, result)
		data = data[:0]
		if err == nil || !errors.Is(err, errNotTheResponse) {
			last = err
			return true
		}
		return false
	}
	for len(body) > 0 {
		var line []byte
		line, body, _ = bytes.Cut(body, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		switch {
		case len(line) == 0:
			if flush() {
				return last
			}
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[5:], []byte(" "))
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, v...)
		}
	}
	if flush() {
		return last
	}
	return last
}

var errNotTheResponse = errors.New("not the response")

// decodeResponse decodes one JSON-RPC message: the response with the
// given id, or errNotTheResponse for any other message.
func decodeResponse(msg []byte, id int64, result any) error {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Result json.RawMessage `json:"result"`
		Error  *rpcError       `json:"error"`
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return fmt.Errorf("decode %s: %w", truncate(msg, 200), err)
	}
	if m.Method != "" || string(m.ID) != strconv.FormatInt(id, 10) {
		return errNotTheResponse
	}
	if m.Error != nil {
		return m.Error
	}
	if m.Result == nil {
		return fmt.Errorf("response without result or error: %s", truncate(msg, 200))
	}
	return json.Unmarshal(m.Result, result)
}

// deviceAliases returns the aliases of the devices with the given ids, in
// that order, from the gateway's device list.
func deviceAliases(ctx context.Context, hc *http.Client, base string, ids []string) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/devices", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("device list: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("device list: HTTP %s", resp.Status)
	}
	var list struct {
		Devices []struct {
			ID    string `json:"id"`
			Alias string `json:"alias"`
		} `json:"devices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("device list: %w", err)
	}
	alias := make(map[string]string, len(list.Devices))
	for _, d := range list.Devices {
		alias[d.ID] = d.Alias
	}
	out := make([]string, len(ids))
	for i, id := range ids {
		a, ok := alias[id]
		if !ok || a == "" {
			return nil, fmt.Errorf("device list: device %s has no alias", id)
		}
		out[i] = a
	}
	return out, nil
}
