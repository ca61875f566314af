package vision_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
)

// TestGatewayPhotoBounds: a gateway sweeps the photos stored before it
// started at once (a photo past the default 7 days goes), applies
// Provisioning's per-device bound at each upload and the default upload
// rate (a burst of 5), and counts both on /metrics.
func TestGatewayPhotoBounds(t *testing.T) {
	const device = "02:00:00:06:cc:01"
	secret := bytes.Repeat([]byte("s"), 32)
	data := t.TempDir()
	dir := filepath.Join(data, "photos", "02_00_00_06_cc_01")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	const old = "20200101T000000Z-00000000"
	for _, name := range []string{old + ".jpg", old + ".json"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	logs := &hostiletest.Logs{}
	gw, _ := gatewaytest.Start(t, gateway.Config{DataDir: data, Logger: logs.Logger(),
		Provisioning: gateway.Provisioning{DeviceSecret: secret, VisionMaxPerDevice: 2}})
	hostiletest.WaitMetric(t, gw.Addr(), `mcpgate_photos_deleted_total{reason="age"}`, 1)
	logs.WaitLine(t, 0, "vision: photos deleted", "reason=age", "photos=1", "trigger=sweep")
	if _, err := os.Stat(filepath.Join(dir, old+".jpg")); !os.IsNotExist(err) {
		t.Fatalf("a photo past the retention is still there: %v", err)
	}

	authority, err := devauth.New(devauth.Config{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := authority.IssueVision(device, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	upload := func() int {
		b, ctype := form(t, jpegBytes(1024))
		req, err := http.NewRequest(http.MethodPost, "http://"+gw.Addr()+"/vision/explain", b)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Device-Id", device)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", ctype)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 5 {
		if status := upload(); status != http.StatusOK {
			t.Fatalf("upload %d: %d", i+1, status)
		}
	}
	if status := upload(); status != http.StatusTooManyRequests {
		t.Fatalf("a sixth upload at once: %d, want 429", status)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 4 {
		t.Errorf("%d files, want the 2 newest photos' images and metadata", len(entries))
	}
	m := hostiletest.Scrape(t, gw.Addr())
	for sample, want := range map[string]float64{
		`mcpgate_photos_deleted_total{reason="device_count"}`: 3,
		`mcpgate_photos_stored`:                               2,
		`mcpgate_limit_hits_total{limit="vision_rate"}`:       1,
	} {
		if got := hostiletest.Sample(t, m, sample); got != want {
			t.Errorf("%s %v, want %v", sample, got, want)
		}
	}
}
