package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
	"github.com/mcpgate/mcpgate/jsonrpc"
)

// echoDevice is an in-memory device that answers every request at once
// from the sending goroutine, so a benchmark measures the gateway alone.
type echoDevice struct{ sess *mcpclient.Session }

func (d *echoDevice) Send(ctx context.Context, payload []byte) error {
	m, err := jsonrpc.Decode(payload)
	if err != nil || m.Kind() != jsonrpc.KindRequest {
		return nil
	}
	var res string
	switch m.Method {
	case "initialize":
		res = `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"echo","version":"1"}}`
	case "tools/list":
		res = `{"tools":[{"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer"}}}}]}`
	default:
		res = `{"content":[{"type":"text","text":"true"}],"isError":false}`
	}
	// Handle never blocks; answering from here is what a fast reader does.
	go d.sess.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":%s}`, m.ID, res))
	return nil
}

func benchHub(b *testing.B, cfg hub.Config) *hub.Hub {
	b.Helper()
	off := limits.Rate{PerSecond: -1}
	cfg.KeyRate, cfg.DeviceRate, cfg.MaxInFlight = off, off, -1
	h := hub.New(cfg)
	d := &echoDevice{}
	ctx, cancel := context.WithCancel(context.Background())
	d.sess = mcpclient.New(ctx, d, mcpclient.Config{RequestTimeout: 10 * time.Second})
	att := h.Attach(hub.ConnInfo{DeviceID: "02:00:00:00:00:01", Transport: "mem"}, d.sess)
	var wg sync.WaitGroup
	wg.Go(func() { att.Run(ctx) })
	b.Cleanup(func() { d.sess.Close(errors.New("over")); cancel(); wg.Wait() })
	for {
		if dev, err := h.Device("02:00:00:00:00:01"); err == nil && dev.State == hub.StateReady {
			return h
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkCallAudit measures what the audit log costs a tool call:
// hub.Call against an in-memory device without an audit hook (off), with
// the real writer and a store that discards (the cost on the call's path:
// digest and queue), and with the writer batching into a real SQLite store
// (whose background writes share the machine's cores with the calls).
// Compare ns/op within one run.
func BenchmarkCallAudit(b *testing.B) {
	for _, bc := range []struct {
		name string
		args string
	}{{"args=small", `{"volume":30}`}, {"args=2KiB", `{"volume":30,"note":"` + longString(2048) + `"}`}} {
		for _, mode := range []string{"off", "discard", "sqlite"} {
			b.Run(bc.name+"/audit="+mode, func(b *testing.B) {
				var cfg hub.Config
				var w *Writer
				stop := func() {}
				if mode != "off" {
					var st Store = discardStore{}
					if mode == "sqlite" {
						st = storetest.Open(b, "", b.TempDir())
					}
					var err error
					if w, err = New(Config{Store: st}); err != nil {
						b.Fatal(err)
					}
					ctx, cancel := context.WithCancel(context.Background())
					done := make(chan error, 1)
					go func() { done <- w.Run(ctx) }()
					stop = func() {
						cancel()
						if err := <-done; err != nil {
							b.Error(err)
						}
					}
					cfg.Audit = w.Record
				}
				h := benchHub(b, cfg)
				args := json.RawMessage(bc.args)
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						res, err := h.Call(context.Background(), hub.CallRequest{Device: "02:00:00:00:00:01",
							Tool: "self.audio_speaker.set_volume", Arguments: args, Caller: "local", Door: "bench"})
						if err != nil || res.IsError {
							b.Errorf("call: %v", err)
							return
						}
					}
				})
				b.StopTimer()
				stop() // all records written before the next run
			})
		}
	}
}

// discardStore accepts every record and keeps none.
type discardStore struct{}

func (discardStore) AppendAudit(context.Context, []store.AuditRecord) error { return nil }
func (discardStore) PruneAudit(context.Context, time.Time, int) (int64, error) {
	return 0, nil
}

func longString(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(i%26)
	}
	return string(b)
}
