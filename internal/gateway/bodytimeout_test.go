package gateway

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
)

// A body trickled in too slowly is cut off at the body deadline (and
// counted), while a call whose body arrived at once may wait for its device
// far longer than that deadline, and keep-alive connections idle past the
// idle timeout are closed.
func TestBodyAndIdleTimeouts(t *testing.T) {
	gw, _ := runGateway(t, Config{DataDir: t.TempDir(), MQTTAddr: "",
		Limits: Limits{ReadBodyTimeout: 300 * time.Millisecond, IdleTimeout: 500 * time.Millisecond}})
	const mac = "02:00:00:00:00:51"
	runDevice(t, gw, mac, newServer(t, device.ProfileESP32, device.Tool{
		Name: "self.slow", Description: "Takes its time.",
		Handler: func(ctx context.Context, _ device.Args) (any, error) {
			time.Sleep(time.Second)
			return "done", nil
		},
	}))
	waitState(t, gw, mac, hub.StateReady)

	// A slow device behind a fast body: the call outlives the body deadline.
	c, err := api.NewClient("http://"+gw.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Call(t.Context(), mac, api.CallBody{Name: "self.slow"})
	if err != nil || res.Text() != "done" {
		t.Fatalf("slow call with a prompt body: %+v, %v", res, err)
	}

	// A trickled body: 10 of 100 bytes, then nothing.
	conn, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	if _, err := io.WriteString(conn, "POST /api/v1/devices/"+mac+"/tools/call HTTP/1.1\r\nHost: "+gw.Addr()+
		"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\":\"s"); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("trickled body answered %d", resp.StatusCode)
		}
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("trickled body held the connection %s", took)
	}
	if n := limitHits(t, gw, limits.BodyTimeout); n != 1 {
		t.Errorf("%s hits = %d, want 1", limits.BodyTimeout, n)
	}

	// An idle keep-alive connection is closed after the idle timeout.
	idle, err := net.Dial("tcp", gw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: "+gw.Addr()+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(idle)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	start = time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("idle keep-alive connection: %v, want EOF", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("idle connection closed after %s", took)
	}
}

// limitHits reads mcpgate_limit_hits_total{limit=...} from /metrics.
func limitHits(t *testing.T, gw *Gateway, limit string) int {
	t.Helper()
	text := scrape(t, gw)
	m := regexp.MustCompile(`(?m)^mcpgate_limit_hits_total\{limit="` + regexp.QuoteMeta(limit) + `"\} (\d+)$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no mcpgate_limit_hits_total for %q in /metrics:\n%s", limit, strings.TrimSpace(text)[:200])
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
