package queue

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/hub/hubtest"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
)

// TestStopGivesUpRecordingOutcome: when the gateway stops while a queued
// call's outcome cannot be stored, Run tries again for DrainTimeout, then
// gives up, logs at error what it could not record, and returns: it does
// not hold the shutdown for ever. The call is left running, for the next
// start to fail as interrupted. Whether the call ends before the stop or
// during it, as a call on a slow device does.
func TestStopGivesUpRecordingOutcome(t *testing.T) {
	for _, tc := range []struct {
		name        string
		endsInDrain bool
	}{{"ends before the stop", false}, {"ends during the stop", true}} {
		t.Run(tc.name, func(t *testing.T) {
			const dev = "02:00:00:00:00:07"
			h, counting, _ := newKickQueue(t, "", dev)
			st := &outageStore{Store: counting.Store, finished: make(chan struct{})}
			st.down.Store(true)
			var logs bytes.Buffer
			q, err := New(Config{Hub: h, Store: st, SweepInterval: time.Hour, DrainTimeout: 200 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			d := &hubtest.Device{
				Tools: []string{`{"name":"self.audio_speaker.set_volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer"}}}}`},
				OnCall: func(ctx context.Context, _ hubtest.Call) (string, error) {
					select {
					case <-release:
						return "true", nil
					case <-ctx.Done():
						return "", ctx.Err()
					}
				},
			}
			hubtest.Connect(t, d, func(s *mcpclient.Session) func(context.Context) {
				return h.Attach(hub.ConnInfo{DeviceID: dev, Transport: "mem"}, s).Run
			})
			hubtest.WaitFor(t, dev+" ready", func() bool {
				d, err := h.Device(dev)
				return err == nil && d.State == hub.StateReady
			})

			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- q.Run(ctx) }()
			<-q.Started()
			q.kick(dev)
			hubtest.WaitFor(t, "the call on the device", func() bool { return d.Calls.Load() == 1 })
			if !tc.endsInDrain {
				close(release)
				<-st.finished
			}
			cancel()
			if tc.endsInDrain {
				close(release)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				st.down.Store(false) // lets Run end
				<-done
				t.Fatal("Run still waited for the outcome to be stored 10 s after the stop, with a DrainTimeout of 200ms")
			}
			if n := st.refused.Load(); tc.endsInDrain && n < 1 || !tc.endsInDrain && n < 2 {
				t.Errorf("the outcome was tried %d times, want a last try at the stop", n)
			}
			got := logs.String()
			for _, want := range []string{"level=ERROR", "call_id=call_busy", "outcome=ok", "interrupted"} {
				if !strings.Contains(got, want) {
					t.Errorf("the log does not say %q:\n%s", want, got)
				}
			}
			if c, err := counting.QueuedCall(t.Context(), "call_busy"); err != nil || c.State != store.CallRunning {
				t.Errorf("the call after the stop: %s, %v; want it left running", c.State, err)
			}
		})
	}
}

// failingCallStore fails the first n updates of a call, then takes them.
type failingCallStore struct {
	store.CallStore
	n int // read and written by recordState's goroutine only
}

func (s *failingCallStore) UpdateCall(context.Context, store.QueuedCall, store.CallState, store.CallAudit) error {
	if s.n > 0 {
		s.n--
		return errors.New("store: database or disk is full")
	}
	return nil
}

// TestOutcomeRetriesWarnOncePerMinute: an outcome the store keeps
// refusing, tried again after 1, 2, 4 ... 30 s, warns once a minute with
// how many failures it left out, as the periodic tasks do, not at every
// try, and says when the store takes it again.
func TestOutcomeRetriesWarnOncePerMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		q, err := New(Config{Hub: hub.New(hub.Config{}), Store: &failingCallStore{n: 8},
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		// Fails at 0, 1, 3, 7, 15, 31, 61 and 91 s; stored at 121 s.
		if err := q.recordState(t.Context(), store.QueuedCall{ID: "call_w", State: store.CallDone}, "recording a queued call's outcome"); err != nil {
			t.Fatal(err)
		}
		got := logs.String()
		if n := strings.Count(got, "level=WARN"); n != 2 {
			t.Errorf("%d warnings for 8 failures in 2 minutes, want 2 (at once, then a minute later):\n%s", n, got)
		}
		if !strings.Contains(got, "suppressed=5") {
			t.Errorf("the second warning does not count the 5 failures left out:\n%s", got)
		}
		if !strings.Contains(got, "the store answers again: recording a queued call's outcome") {
			t.Errorf("no line says the outcome was stored again:\n%s", got)
		}
	})
}
