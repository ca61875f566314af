package queue

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// countingStore counts the queued-call queries the queue makes per device.
type countingStore struct {
	store.Store
	mu        sync.Mutex
	perDevice map[string]int
}

func (s *countingStore) QueuedCalls(ctx context.Context, q store.CallQuery) ([]store.QueuedCall, error) {
	if q.Device != "" {
		s.mu.Lock()
		s.perDevice[q.Device]++
		s.mu.Unlock()
	}
	return s.Store.QueuedCalls(ctx, q)
}

func (s *countingStore) queries(device string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perDevice[device]
}

// newKickQueue returns a queue, its hub (of node nodeID, without rate
// limits) and its counting store, which holds one call "call_busy" queued
// for device busy. It never sweeps: the only workers are the ones a test
// kicks.
func newKickQueue(t *testing.T, nodeID, busy string) (*hub.Hub, *countingStore, *Queue) {
	t.Helper()
	off := limits.Rate{PerSecond: -1}
	h := hub.New(hub.Config{KeyRate: off, DeviceRate: off, NodeID: nodeID})
	st := &countingStore{Store: storetest.Open(t, "", t.TempDir()), perDevice: map[string]int{}}
	q, err := New(Config{Hub: h, Store: st, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := st.CreateCall(t.Context(), store.QueuedCall{ID: "call_busy", Device: busy, Tool: "self.audio_speaker.set_volume",
		Arguments: []byte(`{"volume":1}`), Caller: "k", Door: "rest", State: store.CallQueued, QueuedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	return h, st, q
}

// attachReady attaches an in-memory device with one tool, whose every call
// succeeds, and waits until it is ready.
func attachReady(t *testing.T, h *hub.Hub, id string) {
	t.Helper()
	d := &hubtest.Device{
		Tools:  []string{`{"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer"}}}}`},
		OnCall: func(context.Context, hubtest.Call) (string, error) { return "true", nil },
	}
	hubtest.Connect(t, d, func(s *mcpclient.Session) func(context.Context) {
		return h.Attach(hub.ConnInfo{DeviceID: id, Transport: "mem"}, s).Run
	})
	hubtest.WaitFor(t, id+" ready", func() bool {
		dev, err := h.Device(id)
		return err == nil && dev.State == hub.StateReady
	})
}

// TestKickSkipsStoreForDeviceWithNothingQueued: a device coming online with
// nothing queued for it, the usual case of a session set-up, costs the
// queue no store query; a device with a queued call is queried and served.
func TestKickSkipsStoreForDeviceWithNothingQueued(t *testing.T) {
	const idle, busy = "02:00:00:00:00:01", "02:00:00:00:00:02"
	h, st, q := newKickQueue(t, "", busy)
	// Both devices are ready before Run subscribes, so Run kicks neither
	// for an event: its start-up kicks only the devices it loaded as
	// waiting, and the test kicks the idle one itself.
	attachReady(t, h, idle)
	attachReady(t, h, busy)

	stop := runQueue(t, q)
	q.kick(idle)
	q.kick(busy)
	for {
		c, err := st.QueuedCall(t.Context(), "call_busy")
		if err != nil {
			t.Fatal(err)
		}
		if c.State != store.CallQueued && c.State != store.CallRunning {
			if c.State != store.CallDone {
				t.Fatalf("queued call ended %s (%s), want done", c.State, c.Reason)
			}
			break
		}
		select {
		case <-t.Context().Done():
			t.Fatal("queued call never delivered")
		case <-time.After(5 * time.Millisecond):
		}
	}
	q.wg.Wait() // every worker kicked above has finished
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := st.queries(idle); n != 0 {
		t.Errorf("%d queued-call queries for a device with nothing queued; want none", n)
	}
	if n := st.queries(busy); n == 0 {
		t.Error("no queued-call query for the device with a queued call")
	}
}

// TestClusterReadyDeviceWithNothingQueuedCostsNoQuery: on a cluster node
// too, a device becoming ready with nothing queued costs no store query (a
// reconnect storm is not a storm of reads), while one with a call queued
// before the node started is served when it becomes ready.
func TestClusterReadyDeviceWithNothingQueuedCostsNoQuery(t *testing.T) {
	const idle, busy = "02:00:00:00:00:03", "02:00:00:00:00:04"
	h, st, q := newKickQueue(t, "n1", busy)
	stop := runQueue(t, q)
	// Ready after Run subscribed: each is kicked by its state event, the
	// idle one first.
	attachReady(t, h, idle)
	attachReady(t, h, busy)
	for {
		c, err := st.QueuedCall(t.Context(), "call_busy")
		if err != nil {
			t.Fatal(err)
		}
		if c.State == store.CallDone {
			break
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("queued call %s, never delivered", c.State)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := st.queries(idle); n != 0 {
		t.Errorf("the device with nothing queued cost %d store queries when it became ready, want 0", n)
	}
	if n := st.queries(busy); n == 0 {
		t.Error("the device with a queued call was never queried")
	}
}

// downAtStart is a store whose InterruptCalls fails until up is closed.
type downAtStart struct {
	store.Store
	up chan struct{}
}

func (s *downAtStart) InterruptCalls(ctx context.Context, now time.Time, node string, audit store.CallAudit) ([]store.QueuedCall, error) {
	select {
	case <-s.up:
		return s.Store.InterruptCalls(ctx, now, node, audit)
	default:
		return nil, errors.New("store down")
	}
}

// TestStoreDownAtStartDelaysDelivery: a store that fails when the queue
// starts delays delivery until it is back; it does not end it.
func TestStoreDownAtStartDelaysDelivery(t *testing.T) {
	off := limits.Rate{PerSecond: -1}
	h := hub.New(hub.Config{KeyRate: off, DeviceRate: off})
	st := &downAtStart{Store: storetest.Open(t, "", t.TempDir()), up: make(chan struct{})}
	q, err := New(Config{Hub: h, Store: st, SweepInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- q.Run(ctx) }()
	defer func() { cancel(); <-done }()
	attachReady(t, h, "dev-up")
	c, err := q.Submit(t.Context(), Request{CallRequest: hub.CallRequest{Device: "dev-up", Tool: "self.audio_speaker.set_volume",
		Arguments: []byte(`{"volume":2}`), Door: "rest"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("Run ended while the store was down: %v", err)
	default:
	}
	close(st.up)
	hubtest.WaitFor(t, "the call delivered once the store is back", func() bool {
		got, err := st.QueuedCall(t.Context(), c.ID)
		return err == nil && got.State == store.CallDone
	})
}

// TestCallbackPostedOnceByTwoNodes: two queues on one store (two cluster
// nodes) sweeping the same due callback post it once.
func TestCallbackPostedOnceByTwoNodes(t *testing.T) {
	var posts atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		time.Sleep(50 * time.Millisecond) // a receiver that takes its time: the other sweeps meanwhile
	}))
	defer hook.Close()
	st := storetest.Open(t, "", t.TempDir())
	now := time.Now().UTC()
	if _, err := st.CreateCall(t.Context(), store.QueuedCall{ID: "call_cb", Device: "dev-cb", Tool: "self.t", Arguments: []byte(`{}`),
		Caller: "k", Door: "rest", State: store.CallQueued, QueuedAt: now, ExpiresAt: now.Add(time.Millisecond), CallbackURL: hook.URL}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ExpireCalls(t.Context(), now.Add(time.Second), nil); err != nil {
		t.Fatal(err)
	}
	var queues []*Queue
	for _, node := range []string{"a", "b"} {
		q, err := New(Config{Hub: hub.New(hub.Config{NodeID: node}), Store: st})
		if err != nil {
			t.Fatal(err)
		}
		queues = append(queues, q)
	}
	var wg sync.WaitGroup
	for range 3 {
		for _, q := range queues {
			wg.Go(func() { q.postDue(t.Context()) })
		}
	}
	wg.Wait()
	if n := posts.Load(); n != 1 {
		t.Errorf("the callback was posted %d times, want once", n)
	}
	if c, err := st.QueuedCall(t.Context(), "call_cb"); err != nil || c.CallbackState != store.CallbackDelivered || c.CallbackAttempts != 1 {
		t.Errorf("the call after the sweeps: %+v, %v; want its callback delivered in one try", c, err)
	}
}

// TestCallbackRedirectNotFollowed: a receiver answering a redirect has not
// taken the call: the POST is not turned into a GET elsewhere, and the
// callback is not delivered.
func TestCallbackRedirectNotFollowed(t *testing.T) {
	var gets atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { gets.Add(1) }))
	defer elsewhere.Close()
	hook := httptest.NewServer(http.RedirectHandler(elsewhere.URL, http.StatusFound))
	defer hook.Close()
	q, err := New(Config{Hub: hub.New(hub.Config{}), Store: storetest.Open(t, "", t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	err = q.post(t.Context(), store.QueuedCall{ID: "call_r", Device: "dev-r", Tool: "self.t", CallbackURL: hook.URL})
	if err == nil || !strings.Contains(err.Error(), "302") || gets.Load() != 0 {
		t.Errorf("a callback answered 302: %v, %d requests elsewhere; want an error and none", err, gets.Load())
	}
}

// TestCallbackErrorHidesURL: a failed post's error, which is logged, does
// not repeat the callback URL (its password or query may be a token).
func TestCallbackErrorHidesURL(t *testing.T) {
	q, err := New(Config{Hub: hub.New(hub.Config{}), Store: storetest.Open(t, "", t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	err = q.post(t.Context(), store.QueuedCall{ID: "call_u", Device: "dev-u", Tool: "self.t",
		CallbackURL: "http://user:pw@" + freeport.Refused + "/hook?token=s3cret"})
	if err == nil || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "pw@") {
		t.Errorf("a failed post: %v; want an error without the URL's secrets", err)
	}
}

// outageStore fails every update of a running call while down, as a store
// that cannot be reached does.
type outageStore struct {
	store.Store
	down     atomic.Bool
	refused  atomic.Int32
	finished chan struct{} // closed once an outage has refused an outcome
	once     sync.Once
}

func (s *outageStore) UpdateCall(ctx context.Context, c store.QueuedCall, from store.CallState, audit store.CallAudit) error {
	if s.down.Load() && from == store.CallRunning {
		s.refused.Add(1)
		s.once.Do(func() { close(s.finished) })
		return errors.New("store: connection refused")
	}
	return s.Store.UpdateCall(ctx, c, from, audit)
}

// TestOutcomeRecordedAfterStoreOutage: a call that ends while the store
// cannot be reached is recorded once the store is back, with its result
// (it was left running for good, its result lost).
func TestOutcomeRecordedAfterStoreOutage(t *testing.T) {
	const dev = "02:00:00:00:00:05"
	h, counting, _ := newKickQueue(t, "", dev)
	st := &outageStore{Store: counting.Store, finished: make(chan struct{})}
	q, err := New(Config{Hub: h, Store: st, SweepInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	st.down.Store(true)
	attachReady(t, h, dev)
	stop := runQueue(t, q)
	defer stop()
	q.kick(dev)
	select {
	case <-st.finished:
	case <-t.Context().Done():
		t.Fatal("the call's outcome was never recorded")
	}
	st.down.Store(false)
	hubtest.WaitFor(t, "the outcome recorded after the outage", func() bool {
		c, err := st.QueuedCall(t.Context(), "call_busy")
		return err == nil && c.State == store.CallDone && string(c.Result) != ""
	})
}

// markFailStore fails every attempt to mark a queued call running.
type markFailStore struct{ store.Store }

func (s markFailStore) UpdateCall(ctx context.Context, c store.QueuedCall, from store.CallState, audit store.CallAudit) error {
	if c.State == store.CallRunning && from == store.CallQueued {
		return errors.New("store: disk I/O error")
	}
	return s.Store.UpdateCall(ctx, c, from, audit)
}

// TestMarkRunningFailureWarnsOncePerMinute: a store that keeps failing to
// mark calls running, tried again every second, warns once a minute, as
// the other periodic tasks do, not at every try.
func TestMarkRunningFailureWarnsOncePerMinute(t *testing.T) {
	const dev = "02:00:00:00:00:06"
	h, counting, _ := newKickQueue(t, "", dev)
	attachReady(t, h, dev) // marked running when about to be sent to it
	var logs bytes.Buffer
	q, err := New(Config{Hub: h, Store: markFailStore{counting.Store}, SweepInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c, err := counting.QueuedCall(t.Context(), "call_busy")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := q.deliver(t.Context(), c); got != retryLater {
			t.Fatalf("deliver with the store failing = %v, want retryLater", got)
		}
	}
	if n := strings.Count(logs.String(), "marking a queued call running"); n != 1 {
		t.Errorf("%d warnings for 3 failures in a row, want 1:\n%s", n, logs.String())
	}
}
