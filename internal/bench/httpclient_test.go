package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/internal/freeport"
)

// TestCallers checks both load-generator clients against net/http's server
// in every body framing it uses, on one kept-alive connection.
func TestCallers(t *testing.T) {
	t.Parallel()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /ok", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) != `{"name":"x"}` {
			http.Error(w, "bad body "+string(b), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"content":[{"type":"text","text":"true"}],"isError":false}`)
	})
	mux.HandleFunc("POST /chunked", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"content":[{"type":"text","text":"`)
		w.(http.Flusher).Flush() // forces chunked encoding
		io.WriteString(w, strings.Repeat("a", 5000)+`"}],"isError":false}`)
	})
	mux.HandleFunc("POST /toolerror", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"content":[{"type":"text","text":"boom"}],"isError":true}`)
	})
	mux.HandleFunc("POST /offline", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":{"code":"device_offline","message":"device offline: 02:be:00:00:00:01"}}`)
	})
	mux.HandleFunc("POST /html", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, `<html>bad gateway</html>`)
	})
	mux.HandleFunc("POST /close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, `{"content":[],"isError":false}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	cases := []struct {
		path, want string
	}{
		{"/ok", outcomeOK},
		{"/chunked", outcomeOK},
		{"/toolerror", outcomeToolError},
		{"/offline", "device_offline"},
		{"/html", "http_502"},
		{"/close", outcomeOK},
		{"/ok", outcomeOK}, // after Connection: close, the raw client dials again
	}
	for _, kind := range []string{ClientRaw, ClientStd} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			c := newCaller(kind, srv.URL, "", newStdClient(1))
			defer c.close()
			for _, tc := range cases {
				got, err := c.call(context.Background(), tc.path, []byte(`{"name":"x"}`))
				if got != tc.want {
					t.Errorf("%s: outcome %q (%v), want %q", tc.path, got, err, tc.want)
				}
				if (got == outcomeOK) != (err == nil) {
					t.Errorf("%s: outcome %q with error %v", tc.path, got, err)
				}
			}
		})
	}
}

func TestRawCallerReportsTransportErrors(t *testing.T) {
	t.Parallel()
	c := newCaller(ClientRaw, "http://"+freeport.Refused, "", nil)
	defer c.close()
	got, err := c.call(context.Background(), "/x", []byte(`{}`))
	if got != outcomeTransport || err == nil {
		t.Errorf("call to a closed server: %q, %v; want %q and an error", got, err, outcomeTransport)
	}
}

func TestRawCallerStopsWithContext(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	t.Cleanup(func() { close(block); srv.Close() })
	c := newCaller(ClientRaw, srv.URL, "", nil)
	defer c.close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan string)
	go func() {
		got, _ := c.call(ctx, "/slow", []byte(`{}`))
		done <- got
	}()
	cancel()
	if got := <-done; got != outcomeTransport {
		t.Errorf("cancelled call: %q, want %q", got, outcomeTransport)
	}
}

func TestLoadBody(t *testing.T) {
	t.Parallel()
	l := newLoad("http://x", "", []string{"/p"}, 1, ClientRaw, DefaultTool, nil)
	if got, want := string(l.body(nil, 137)), `{"name":"self.audio_speaker.set_volume","arguments":{"volume":36}}`; got != want {
		t.Errorf("body = %s, want %s", got, want)
	}
	l = newLoad("http://x", "", []string{"/p"}, 1, ClientRaw, "self.get_device_status", []byte(`{}`))
	if got, want := string(l.body(nil, 1)), `{"name":"self.get_device_status","arguments":{}}`; got != want {
		t.Errorf("body = %s, want %s", got, want)
	}
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	in := `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
mcpgate_sessions_open{transport="websocket"} 7
mcpgate_sessions_open{transport="mqtt"} 3
weird{label="a b}c"} 1.5e+06 1700000000000
process_resident_memory_bytes 1.2345e+07
`
	s, err := parseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if v := s.sum("go_goroutines"); v != 42 {
		t.Errorf("go_goroutines = %v", v)
	}
	if v := s.sum("mcpgate_sessions_open"); v != 10 {
		t.Errorf("sum of mcpgate_sessions_open = %v, want 10", v)
	}
	if v := s.sum("mcpgate_sessions"); v != 0 {
		t.Errorf("a prefix of a name matched: %v", v)
	}
	if v, ok := s.get(`weird{label="a b}c"}`); !ok || v != 1.5e6 {
		t.Errorf("labels with spaces and braces: %v %v", v, ok)
	}
	if _, err := parseMetrics(strings.NewReader("novalue\n")); err == nil {
		t.Error("a line without value parsed")
	}
}

func TestRPCResponse(t *testing.T) {
	t.Parallel()
	type res struct {
		IsError bool `json:"isError"`
	}
	for _, tc := range []struct {
		name, body string
		isError    bool
		err        string
	}{
		{"json", `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`, false, ""},
		{"json error flag", `{"jsonrpc":"2.0","id":7,"result":{"isError":true}}`, true, ""},
		{"sse", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n", false, ""},
		{"sse crlf after notification", "event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\r\n\r\n" +
			"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"isError\":true}}\r\n\r\n", true, ""},
		{"sse without blank line at the end", "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}", false, ""},
		{"rpc error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad"}}`, false, "-32602"},
		{"other id", `{"jsonrpc":"2.0","id":8,"result":{}}`, false, "not the response"},
		{"empty sse", "event: message\n\n", false, "no JSON-RPC response"},
	} {
		var r res
		err := rpcResponse([]byte(tc.body), 7, &r)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err = %v, want one with %q", tc.name, err, tc.err)
		case tc.err == "" && r.IsError != tc.isError:
			t.Errorf("%s: isError = %v", tc.name, r.IsError)
		}
	}
}
