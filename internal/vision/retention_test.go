package vision

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/metrics"
)

const dev2 = "02:00:00:00:00:02"

// clock is a settable Config.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// jpegOf is n bytes starting with JPEG's magic.
func jpegOf(n int) []byte {
	b := bytes.Repeat([]byte{0x42}, n)
	copy(b, []byte{0xFF, 0xD8, 0xFF, 0xE0})
	return b
}

// upload posts a photo of n bytes as device, a second after the last one,
// and returns the stored photo's id.
func (f *fixture) upload(t *testing.T, clk *clock, device string, n int) string {
	t.Helper()
	clk.add(time.Second)
	tok, err := f.auth.IssueVision(device, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, ct := form(t, "what?", jpegOf(n))
	status, body := f.post(t, device, tok, b, ct)
	if status != http.StatusOK {
		t.Fatalf("upload as %s: %d %s", device, status, body)
	}
	var answer struct{ Photo string }
	if err := json.Unmarshal([]byte(body), &answer); err != nil || answer.Photo == "" {
		t.Fatalf("answer %q: %v", body, err)
	}
	return answer.Photo
}

// photos returns what GET /api/v1/devices/{device}/photos lists.
func (f *fixture) photos(t *testing.T, device string) []Photo {
	t.Helper()
	resp, err := http.Get(f.srv.URL + "/api/v1/devices/" + device + "/photos")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list PhotoList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return list.Photos
}

// listed returns the ids of the photos listed, oldest first.
func (f *fixture) listed(t *testing.T, device string) []string {
	t.Helper()
	ids := []string{}
	for _, p := range f.photos(t, device) {
		ids = append(ids, p.ID)
	}
	slices.Reverse(ids)
	return ids
}

// files lists the files of a device's photo directory.
func (f *fixture) files(t *testing.T, device string) []string {
	t.Helper()
	entries, err := os.ReadDir(f.svc.deviceDir(device))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func (f *fixture) deletedBy(reason string) float64 {
	return counterValue(f.svc.deleted.WithLabelValues(reason))
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

func wantIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %v, want %v", what, got, want)
	}
}

// TestDeviceBounds: a device's upload past its bound deletes its oldest
// photos, images and metadata, and nothing of another device.
func TestDeviceBounds(t *testing.T) {
	t.Parallel()
	const size = 10_000 // each photo, about 300 bytes of metadata besides
	for _, tc := range []struct {
		name   string
		cfg    Config
		reason string
	}{
		{"count", Config{MaxPerDevice: 3, MaxDeviceBytes: -1}, DeletedDeviceCount},
		{"bytes", Config{MaxPerDevice: -1, MaxDeviceBytes: 3*size + 2000, MaxBytes: 16 << 10}, DeletedDeviceBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			tc.cfg.Now = clk.now
			f := newFixtureWith(t, tc.cfg)
			other := f.upload(t, clk, dev2, size)
			var ids []string
			for range 5 {
				ids = append(ids, f.upload(t, clk, dev, size))
			}
			wantIDs(t, "kept", f.listed(t, dev), ids[2:])
			if files := f.files(t, dev); len(files) != 6 {
				t.Errorf("files left: %v, want the 3 newest photos' images and metadata", files)
			}
			for _, id := range ids[:2] {
				if _, err := os.Stat(filepath.Join(f.svc.deviceDir(dev), id+".jpg")); !os.IsNotExist(err) {
					t.Errorf("photo %s not deleted: %v", id, err)
				}
			}
			wantIDs(t, "the other device's", f.listed(t, dev2), []string{other})
			if got := f.deletedBy(tc.reason); got != 2 {
				t.Errorf("deleted{reason=%s} %v, want 2", tc.reason, got)
			}
		})
	}
}

// TestTotalBound: past the total bound, the oldest photo of any device is
// deleted, whichever device uploads.
func TestTotalBound(t *testing.T) {
	t.Parallel()
	const size = 10_000
	clk := newClock()
	f := newFixtureWith(t, Config{Now: clk.now, MaxPerDevice: -1, MaxDeviceBytes: -1, MaxTotalBytes: 3*size + 1000, MaxBytes: 16 << 10})
	a := f.upload(t, clk, dev, size)
	b := f.upload(t, clk, dev2, size)
	c := f.upload(t, clk, dev, size)
	wantIDs(t, "three fit", f.listed(t, dev), []string{a, c})
	d := f.upload(t, clk, dev2, size)
	wantIDs(t, "the first device's after the fourth", f.listed(t, dev), []string{c})
	wantIDs(t, "the second device's after the fourth", f.listed(t, dev2), []string{b, d})
	e := f.upload(t, clk, dev, size)
	wantIDs(t, "the first device's after the fifth", f.listed(t, dev), []string{c, e})
	wantIDs(t, "the second device's after the fifth", f.listed(t, dev2), []string{d})
	if got := f.deletedBy(DeletedTotalBytes); got != 2 {
		t.Errorf("deleted{reason=total_bytes} %v, want 2", got)
	}
}

// TestByteBoundsKeepNewestPhoto: byte bounds equal to MaxBytes, which
// serve accepts, keep the newest photo although its metadata (question,
// explanation) takes it past them; the next upload deletes the older.
func TestByteBoundsKeepNewestPhoto(t *testing.T) {
	t.Parallel()
	const maxBytes = 1000
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"choices":[{"message":{"content":"a cat"}}]}`)
	}))
	t.Cleanup(stub.Close) // after the parallel subtests
	for _, tc := range []struct {
		name   string
		cfg    Config
		reason string
	}{
		{"device", Config{MaxDeviceBytes: maxBytes, MaxTotalBytes: -1}, DeletedDeviceBytes},
		{"total", Config{MaxDeviceBytes: -1, MaxTotalBytes: maxBytes}, DeletedTotalBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			tc.cfg.Now, tc.cfg.MaxBytes, tc.cfg.MaxPerDevice = clk.now, maxBytes, -1
			tc.cfg.Model = &Model{BaseURL: stub.URL, Name: "m"}
			f := newFixtureWith(t, tc.cfg)
			tok, _ := f.auth.IssueVision(dev, time.Hour)
			var ids []string
			for i := range 2 {
				clk.add(time.Second)
				b, ct := form(t, "what is it?", jpegOf(990))
				if status, body := f.post(t, dev, tok, b, ct); status != 200 || body != "a cat" {
					t.Fatalf("upload %d: %d %q", i, status, body)
				}
				ids = f.listed(t, dev)
				if len(ids) != 1 {
					t.Fatalf("after upload %d: %v, want the newest photo", i, ids)
				}
				resp, err := http.Get(f.srv.URL + "/api/v1/devices/" + dev + "/photos/" + ids[0])
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Fatalf("after upload %d: GET the photo: %d", i, resp.StatusCode)
				}
			}
			if got := f.deletedBy(tc.reason); got != 1 {
				t.Errorf("deleted{reason=%s} %v, want 1: the first photo", tc.reason, got)
			}
		})
	}
}

// TestRetention: a photo past the retention is deleted by the next upload
// of any device, and by the periodic sweep without one.
func TestRetention(t *testing.T) {
	t.Parallel()
	clk := newClock()
	f := newFixtureWith(t, Config{Now: clk.now, SweepInterval: 10 * time.Millisecond})
	old := f.upload(t, clk, dev, 100)
	clk.add(DefaultRetention - time.Minute)
	kept := f.upload(t, clk, dev2, 100)
	wantIDs(t, "a day short of the retention", f.listed(t, dev), []string{old})
	clk.add(2 * time.Minute)
	f.upload(t, clk, dev2, 100)
	wantIDs(t, "past the retention, after another device's upload", f.listed(t, dev), []string{})

	clk.add(DefaultRetention + time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.svc.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for len(f.listed(t, dev2)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweep left %v (%s) past the retention", f.listed(t, dev2), kept)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.deletedBy(DeletedAge); got != 3 {
		t.Errorf("deleted{reason=age} %v, want 3", got)
	}
}

// TestSweepAtStart: a service started on photos stored before applies its
// bounds to them at once, leaves files not its own alone, and a negative
// retention keeps photos forever.
func TestSweepAtStart(t *testing.T) {
	t.Parallel()
	clk := newClock()
	dir := t.TempDir()
	before := newFixtureWith(t, Config{Dir: dir, Now: clk.now, Retention: -1, MaxPerDevice: -1})
	var ids []string
	for range 4 {
		ids = append(ids, before.upload(t, clk, dev, 100))
	}
	other := before.upload(t, clk, dev2, 100)
	notes := filepath.Join(before.svc.deviceDir(dev), "notes.txt")
	if err := os.WriteFile(notes, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}

	clk.add(1000 * 24 * time.Hour)
	forever := newFixtureWith(t, Config{Dir: dir, Now: clk.now, Retention: -1, MaxPerDevice: 2})
	if err := forever.svc.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "kept forever, the newest 2", forever.listed(t, dev), ids[2:])
	wantIDs(t, "kept forever, the other device's", forever.listed(t, dev2), []string{other})

	clk.add(-999 * 24 * time.Hour)
	after := newFixtureWith(t, Config{Dir: dir, Now: clk.now, MaxPerDevice: 1})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); after.svc.Run(ctx) }() // sweeps at once, then hourly
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for len(after.listed(t, dev)) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no sweep at start: %v", after.listed(t, dev))
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantIDs(t, "the newest", after.listed(t, dev), ids[3:])
	if _, err := os.Stat(notes); err != nil {
		t.Errorf("a file not a photo's was deleted: %v", err)
	}
	if n, b := after.svc.shelfSize(); n != 2 || b <= 200 {
		t.Errorf("after the sweep: %d photos, %d bytes; want 2", n, b)
	}
}

// TestPhotoBeingExplainedIsKept: a device's upload past its bound while its
// previous photo is still being explained keeps that photo until its
// explanation is written, then deletes it, metadata and all.
func TestPhotoBeingExplainedIsKept(t *testing.T) {
	t.Parallel()
	asked := make(chan struct{}, 2)
	release := make(chan struct{})
	var n int
	var mu sync.Mutex
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		asked <- struct{}{}
		if first {
			<-release
		}
		fmt.Fprintf(w, `{"choices":[{"message":{"content":"explanation %v"}}]}`, first)
	}))
	defer stub.Close()
	defer close(release) // unless released already: see below
	clk := newClock()
	f := newFixtureWith(t, Config{Now: clk.now, MaxPerDevice: 1, Model: &Model{BaseURL: stub.URL, Name: "m"}})
	tok, _ := f.auth.IssueVision(dev, time.Hour)

	type answer struct {
		status int
		body   string
	}
	firstDone := make(chan answer, 1)
	go func() {
		b, ct := form(t, "first", jpegOf(100))
		status, body := f.post(t, dev, tok, b, ct)
		firstDone <- answer{status, body}
	}()
	<-asked
	first := f.listed(t, dev)
	if len(first) != 1 {
		t.Fatalf("while explained: %v", first)
	}
	clk.add(time.Second)
	b, ct := form(t, "second", jpegOf(100))
	if status, body := f.post(t, dev, tok, b, ct); status != 200 || body != "explanation false" {
		t.Fatalf("second upload: %d %q", status, body)
	}
	if _, err := os.Stat(filepath.Join(f.svc.deviceDir(dev), first[0]+".jpg")); err != nil {
		t.Fatalf("the photo being explained was deleted: %v", err)
	}
	release <- struct{}{}
	if a := <-firstDone; a.status != 200 || a.body != "explanation true" {
		t.Fatalf("first upload: %d %q", a.status, a.body)
	}
	list := f.listed(t, dev)
	if len(list) != 1 || list[0] == first[0] {
		t.Fatalf("after the explanation: %v, want the second photo only", list)
	}
	if files := f.files(t, dev); len(files) != 2 {
		t.Errorf("files left: %v, want the second photo's image and metadata", files)
	}
	if got := f.deletedBy(DeletedDeviceCount); got != 1 {
		t.Errorf("deleted{reason=device_count} %v, want 1", got)
	}
}

// TestUploadRate: a device's uploads beyond its burst get 429 with
// Retry-After, are counted as vision_rate and store nothing; another
// device is not affected.
func TestUploadRate(t *testing.T) {
	t.Parallel()
	m := metrics.New()
	clk := newClock()
	// A token every 2.5 s: the third upload waits about 2.49 s, which the
	// header and the text both round up.
	f := newFixtureWith(t, Config{Now: clk.now, UploadRate: limits.Rate{PerSecond: 0.4, Burst: 2}, Limits: limits.NewReporter(m, nil)})
	f.upload(t, clk, dev, 100)
	f.upload(t, clk, dev, 100)
	tok, _ := f.auth.IssueVision(dev, time.Hour)
	b, ct := form(t, "third", jpegOf(100))
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+Path, b)
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Device-Id", dev)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	retry := resp.Header.Get("Retry-After")
	if secs, _ := strconv.Atoi(retry); resp.StatusCode != http.StatusTooManyRequests || secs < 1 {
		t.Fatalf("third upload: %d, Retry-After %q", resp.StatusCode, retry)
	}
	if want := "try again in " + retry + "s"; !strings.Contains(string(body), want) {
		t.Errorf("429 body %q, want it to say %q as Retry-After does", body, want)
	}
	if got := len(f.listed(t, dev)); got != 2 {
		t.Errorf("%d photos stored, want 2", got)
	}
	f.upload(t, clk, dev2, 100)
	if got := counterValue(m.LimitHits.WithLabelValues(limits.VisionRate)); got != 1 {
		t.Errorf("limit hits %v, want 1", got)
	}
}

// TestBoundsBelowLargestPhotoRefused: a byte bound below MaxBytes is a
// configuration error.
func TestBoundsBelowLargestPhotoRefused(t *testing.T) {
	t.Parallel()
	verify := func(string, string, string) error { return nil }
	for _, cfg := range []Config{
		{Dir: "x", Verify: verify, MaxBytes: 1 << 20, MaxDeviceBytes: 1 << 10},
		{Dir: "x", Verify: verify, MaxBytes: 1 << 20, MaxTotalBytes: 1 << 10},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// TestListNewestFirstWithinASecond: photos taken in one second (their ids
// share it, then random hex) are listed by when they were taken.
func TestListNewestFirstWithinASecond(t *testing.T) {
	clk := newClock()
	f := newFixtureWith(t, Config{Now: clk.now})
	var want []string
	for range 8 {
		clk.add(time.Millisecond - time.Second) // upload adds a second
		want = append(want, f.upload(t, clk, dev, 100))
	}
	if got := f.listed(t, dev); !slices.Equal(got, want) {
		t.Fatalf("listed oldest first %v, want upload order %v", got, want)
	}
}
