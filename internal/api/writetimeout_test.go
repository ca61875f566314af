package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
)

// The write deadline of one answer is lifted once it is out: a keep-alive
// connection idle for longer than the write timeout still carries the next
// answer (TestHostileRESTClients has the reader that never reads).
func TestWriteTimeoutLiftedBetweenAnswers(t *testing.T) {
	gw, _ := gatewaytest.Start(t, gateway.Config{Limits: gateway.Limits{WriteTimeout: 200 * time.Millisecond}})
	const id = "02:00:00:00:0c:31"
	gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: id})
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	client := hostiletest.Client(t)
	for i := range 3 {
		reused := false
		trace := &httptrace.ClientTrace{GotConn: func(c httptrace.GotConnInfo) { reused = c.Reused }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost,
			"http://"+gw.Addr()+"/api/v1/devices/"+id+"/tools/call",
			strings.NewReader(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":7}}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // to EOF, so the connection is reused
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: HTTP %d", i, resp.StatusCode)
		}
		if i > 0 && !reused {
			t.Fatalf("call %d did not reuse the keep-alive connection: the test proves nothing", i)
		}
		time.Sleep(400 * time.Millisecond) // twice the write timeout
	}
}
