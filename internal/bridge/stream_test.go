package bridge_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/transport/endpoint"
)

// streamServer is a Streamable HTTP MCP server (JSON answers, no session)
// whose tools/call answer is an SSE stream that ends before the result:
// after one progress event, cleanly ("eof"), or with the connection cut
// ("cut"). With ids, the progress event has id 1, and a GET with
// Last-Event-ID 1 gets the result.
func streamServer(t *testing.T, end string, ids bool) (*httptest.Server, *atomic.Int32) {
	srv := mcptest.New("streamy")
	resumes := &atomic.Int32{}
	var result atomic.Value // the tools/call answer, sent on resumption
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			if !ids || r.Header.Get("Last-Event-ID") != "1" {
				http.Error(w, "no stream", http.StatusMethodNotAllowed)
				return
			}
			resumes.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "id: 2\ndata: %s\n\n", result.Load())
			return
		}
		if r.Method != http.MethodPost {
			return
		}
		body, _ := io.ReadAll(r.Body)
		reply := srv.Handle(body)
		if reply == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		if !strings.Contains(string(body), `"tools/call"`) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(reply)
			return
		}
		result.Store(string(reply))
		var req struct {
			Params struct {
				Meta struct {
					ProgressToken json.RawMessage `json:"progressToken"`
				} `json:"_meta"`
			} `json:"params"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "text/event-stream")
		if ids {
			fmt.Fprint(w, "id: 1\nretry: 10\n")
		}
		fmt.Fprintf(w, `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":%s,"progress":1}}`+"\n\n",
			req.Params.Meta.ProgressToken)
		if end == "cut" {
			w.(http.Flusher).Flush()
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}
	}))
	t.Cleanup(hs.Close)
	return hs, resumes
}

// An answer stream that ends before the result fails the call at once
// with why, or, when its events have ids, is resumed with GET and
// Last-Event-ID and the result arrives.
func TestHTTPAnswerStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		end  string
		ids  bool
		want string // "" for the result
	}{
		{"eof", false, "MCP server unreachable: the answer stream ended before the result"},
		{"cut", false, "MCP server unreachable: the answer stream broke before the result"},
		{"eof", true, ""},
		{"cut", true, ""},
	} {
		t.Run(fmt.Sprintf("%s/ids=%v", tc.end, tc.ids), func(t *testing.T) {
			gw := startGateway(t)
			hs, resumes := streamServer(t, tc.end, tc.ids)
			runBridge(t, bridge.Config{
				URL:     "ws://" + gw.Addr() + endpoint.Path,
				Servers: []bridge.Server{{Name: "streamy", URL: hs.URL}},
			})
			waitReady(t, gw.Hub(), "streamy", 3)
			start := time.Now()
			got, err := call(t, gw.Hub(), "streamy", "add", `{"a":1,"b":2}`)
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("the call took %s", took)
			}
			switch {
			case tc.want == "" && (err != nil || !strings.Contains(got, `"text":"3"`) || resumes.Load() != 1):
				t.Fatalf("add = %s, %v after %d resumptions; want the result after one", got, err, resumes.Load())
			case tc.want != "" && (err != nil || !strings.Contains(got, `"isError":true`) || !strings.Contains(got, tc.want)):
				t.Fatalf("add = %s, %v; want %q", got, err, tc.want)
			}
		})
	}
}
