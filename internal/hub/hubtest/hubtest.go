// Package hubtest is an in-memory MCP device for the tests of the hub and
// of the packages that drive it (the queue, the cluster). Only tests import
// it.
//
// It does not import the hub, so that the hub's own internal tests can use
// it too: the caller attaches the device's session itself, in the function
// it hands to [Connect]:
//
//	d := &hubtest.Device{Tools: []string{tool}}
//	hubtest.Connect(t, d, func(s *mcpclient.Session) func(context.Context) {
//		return h.Attach(hub.ConnInfo{DeviceID: id, Transport: "mem"}, s).Run
//	})
//	hubtest.WaitFor(t, id+" ready", func() bool { ... })
package hubtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/jsonrpc"
)

// Call is one tools/call a Device received.
type Call struct {
	Name string
	Args json.RawMessage
	// ProgressToken is the caller's _meta.progressToken; nil without one.
	ProgressToken json.RawMessage
}

// Device is an in-memory device: an [mcpclient.Link] whose requests are
// answered by [Device.Serve] through the session's Handle, as a transport's
// reader would. It answers initialize, tools/list with Tools, and each
// tools/call with OnCall.
//
// Set the fields before [Device.Open]. Tools is read at each tools/list, so
// a test may change it once the device has answered the previous one and
// before it sends the next request.
type Device struct {
	// Tools are the raw JSON tool objects of the tools/list answer.
	Tools []string
	// OnCall answers a tools/call, in a goroutine of its own so that it may
	// block until ctx (the device's life) is done. It returns the text of a
	// successful result, or an error sent as a JSON-RPC error with its
	// message. Nothing is sent once ctx is done. Nil answers every call with
	// its arguments as text.
	OnCall func(ctx context.Context, c Call) (text string, err error)
	// ListDelay delays each tools/list answer: a device slow to be
	// discovered.
	ListDelay time.Duration
	// Calls counts the tools/call requests received.
	Calls atomic.Int64

	sess *mcpclient.Session
	in   chan []byte
}

// Open makes the session the gateway drives d through; ctx is its life.
func (d *Device) Open(ctx context.Context) *mcpclient.Session {
	d.in = make(chan []byte, 16)
	d.sess = mcpclient.New(ctx, d, mcpclient.Config{RequestTimeout: 10 * time.Second})
	return d.sess
}

// Session is the session made by Open.
func (d *Device) Session() *mcpclient.Session { return d.sess }

// Send queues payload for Serve.
func (d *Device) Send(ctx context.Context, payload []byte) error {
	select {
	case d.in <- payload:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Serve answers what the session sends until ctx is done, then waits for
// the OnCall goroutines it started.
func (d *Device) Serve(ctx context.Context) {
	var calls sync.WaitGroup
	defer calls.Wait()
	for {
		var b []byte
		select {
		case b = <-d.in:
		case <-ctx.Done():
			return
		}
		m, err := jsonrpc.Decode(b)
		if err != nil || m.Kind() != jsonrpc.KindRequest {
			continue
		}
		switch m.Method {
		case "initialize":
			d.reply(m.ID, `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"mem","version":"1.0"}}`)
		case "tools/list":
			if d.ListDelay <= 0 {
				d.reply(m.ID, `{"tools":[`+strings.Join(d.Tools, ",")+`]}`)
				continue
			}
			calls.Go(func() {
				select {
				case <-time.After(d.ListDelay):
					d.reply(m.ID, `{"tools":[`+strings.Join(d.Tools, ",")+`]}`)
				case <-ctx.Done():
				}
			})
		case "tools/call":
			d.Calls.Add(1)
			var p struct {
				Name string          `json:"name"`
				Args json.RawMessage `json:"arguments"`
				Meta struct {
					Token json.RawMessage `json:"progressToken"`
				} `json:"_meta"`
			}
			_ = json.Unmarshal(m.Params, &p)
			c := Call{Name: p.Name, Args: p.Args, ProgressToken: p.Meta.Token}
			calls.Go(func() { d.answer(ctx, m.ID, c) })
		}
	}
}

func (d *Device) answer(ctx context.Context, id jsonrpc.ID, c Call) {
	text, err := string(c.Args), error(nil)
	if d.OnCall != nil {
		text, err = d.OnCall(ctx, c)
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		msg, _ := json.Marshal(err.Error())
		d.sess.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"error":{"message":%s}}`, id, msg))
		return
	}
	t, _ := json.Marshal(text)
	d.reply(id, fmt.Sprintf(`{"content":[{"type":"text","text":%s}],"isError":false}`, t))
}

func (d *Device) reply(id jsonrpc.ID, result string) {
	d.sess.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result))
}

// Progress sends one notifications/progress for c, if its caller asked for
// progress.
func (d *Device) Progress(c Call, progress int) {
	if c.ProgressToken != nil {
		d.sess.Handle(fmt.Appendf(nil, `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":%s,"progress":%d}}`, c.ProgressToken, progress))
	}
}

// Connect opens d's session on tb's context, hands it to attach (which
// attaches it to a hub and returns the attachment's Run), and runs d and
// that Run until stop is called or the test ends. stop closes the session
// with reason and waits for both; calling it again does nothing.
func Connect(tb testing.TB, d *Device, attach func(*mcpclient.Session) (run func(context.Context))) (stop func(reason error)) {
	tb.Helper()
	run := attach(d.Open(tb.Context()))
	ctx, cancel := context.WithCancel(tb.Context())
	var wg sync.WaitGroup
	wg.Go(func() { d.Serve(ctx) })
	wg.Go(func() { run(ctx) })
	var once sync.Once
	stop = func(reason error) {
		once.Do(func() {
			d.sess.Close(reason)
			cancel()
			wg.Wait()
		})
	}
	tb.Cleanup(func() { stop(errors.New("test over")) })
	return stop
}

// WaitFor polls cond until it holds, failing tb after 10 seconds.
func WaitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
