package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// BenchmarkAppendAudit appends batches of 100 records, as the audit writer
// does; records/s is the figure to read. Sequential (one writer, as the
// gateway has) and parallel (several stores or processes writing at once).
// The context can be cancelled, as the writer's is: drivers pay for
// watching it.
func BenchmarkAppendAudit(b *testing.B) {
	targets := []struct {
		name string
		dsn  func(b *testing.B) string
	}{
		{"sqlite", func(*testing.B) string { return "" }},
	}
	if os.Getenv(storetest.EnvPostgres) != "" {
		targets = append(targets, struct {
			name string
			dsn  func(b *testing.B) string
		}{"postgres", func(b *testing.B) string { return storetest.PostgresDSN(b) }})
	}
	const batchSize = 100
	batch := make([]store.AuditRecord, batchSize)
	for i := range batch {
		batch[i] = store.AuditRecord{Time: time.Now(), Caller: "k_abc123", Door: "mcp", Device: fmt.Sprintf("aa:bb:cc:dd:ee:%02x", i),
			Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":30}`), Outcome: "ok", LatencyMS: 12.5}
	}
	for _, tg := range targets {
		b.Run(tg.name+"/serial", func(b *testing.B) {
			s := storetest.Open(b, tg.dsn(b), b.TempDir())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			for b.Loop() {
				if err := s.AppendAudit(ctx, batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "records/s")
		})
		b.Run(tg.name+"/parallel", func(b *testing.B) {
			s := storetest.Open(b, tg.dsn(b), b.TempDir())
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := s.AppendAudit(ctx, batch); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*batchSize)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkSaveDevices writes a thousand devices, as the hub's persister does
// when a fleet comes online or goes offline at once: one SaveDevice each,
// against one SaveDevices. devices/s is the figure to read.
func BenchmarkSaveDevices(b *testing.B) {
	const n = 1000
	ds := make([]store.Device, n)
	for i := range ds {
		ds[i] = store.Device{ID: fmt.Sprintf("02:be:00:00:%02x:%02x", i>>8, i&0xff), Alias: fmt.Sprintf("bench-%d", i),
			Kind: "xiaozhi", Transport: "websocket", Board: "bread-compact-wifi", Firmware: "2.4.2",
			FirstSeen: time.Now(), LastSeen: time.Now(), CatalogHash: "0123456789abcdef"}
	}
	targets := []struct {
		name string
		dsn  func(b *testing.B) string
	}{
		{"sqlite", func(*testing.B) string { return "" }},
	}
	if os.Getenv(storetest.EnvPostgres) != "" {
		targets = append(targets, struct {
			name string
			dsn  func(b *testing.B) string
		}{"postgres", func(b *testing.B) string { return storetest.PostgresDSN(b) }})
	}
	for _, tg := range targets {
		b.Run(tg.name+"/one_by_one", func(b *testing.B) {
			s := storetest.Open(b, tg.dsn(b), b.TempDir())
			ctx := context.Background()
			for b.Loop() {
				for _, d := range ds {
					if err := s.SaveDevice(ctx, d); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "devices/s")
		})
		b.Run(tg.name+"/batch", func(b *testing.B) {
			s := storetest.Open(b, tg.dsn(b), b.TempDir())
			bs, ok := s.(interface {
				SaveDevices(context.Context, []store.Device) error
			})
			if !ok {
				b.Fatalf("%T has no SaveDevices", s)
			}
			ctx := context.Background()
			for b.Loop() {
				if err := bs.SaveDevices(ctx, ds); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "devices/s")
		})
	}
}
