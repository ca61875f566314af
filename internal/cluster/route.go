package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// callMsg is a call routed to the node holding the device.
type callMsg struct {
	ID        string          `json:"id"`
	Node      string          `json:"node"` // the taking node
	Device    string          `json:"device"`
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	TimeoutMS int64           `json:"timeout_ms,omitempty"`
	Caller    string          `json:"caller,omitempty"`
	Door      string          `json:"door,omitempty"`
	Meta      json.RawMessage `json:"meta,omitempty"`
	Progress  bool            `json:"progress,omitempty"` // the caller wants progress
	// ReportSend: the caller waits to hear when the call is about to be
	// sent to the device (kindSend), and confirms it, to run its
	// CallRequest.OnSend then. Binary only, as SharedReply.
	ReportSend bool `json:"-"`
	// SharedReply: reply on the caller's shared reply subject (fast.go).
	// Binary only: a node of a version that sent JSON did not have it.
	SharedReply bool `json:"-"`
}

// Kinds of replyMsg.
const (
	kindProgress = "progress"
	kindAlive    = "alive"
	kindResult   = "result"
	// kindSend: the call is about to be sent to the device (ReportSend).
	// It carries a NATS reply subject: the taking node answers it empty to
	// go on, or with why the call must not be sent.
	kindSend = "send"
)

// sendConfirmWait bounds how long a serving node waits for the taking node
// to confirm a send (kindSend); past it the call ends unsent.
const sendConfirmWait = 10 * time.Second

// replyMsg is one message on a routed call's reply inbox.
type replyMsg struct {
	Kind     string            `json:"kind"`
	Node     string            `json:"node,omitempty"` // the serving node
	Progress json.RawMessage   `json:"progress,omitempty"`
	Result   *mcpclient.Result `json:"result,omitempty"`
	// A gateway error: its code (hub.Code), message, and what some codes carry.
	Code         string        `json:"code,omitempty"`
	Error        string        `json:"error,omitempty"`
	NotSent      bool          `json:"not_sent,omitempty"`
	Limit        string        `json:"limit,omitempty"`
	RetryAfterMS int64         `json:"retry_after_ms,omitempty"`
	Tool         string        `json:"tool,omitempty"`
	Problems     []hub.Problem `json:"problems,omitempty"`
}

// Call sends a call to the node holding device id and waits for its answer
// (hub.Cluster). No node holding it: ErrDeviceOffline at once.
func (n *Node) Call(ctx context.Context, id string, req hub.CallRequest) (*mcpclient.Result, error) {
	res, err := n.call(ctx, id, req)
	n.metrics.count("sent", res, err)
	return res, err
}

// AbortSent fails with device_disconnected, at once, every call this node
// sent to another and still awaits, telling the serving nodes to cancel
// them, and refuses to send more (device_offline, not sent): at the end of
// a shutdown's drain, as a local device's calls fail when its connection
// closes.
func (n *Node) AbortSent() { n.abortOnce.Do(func() { close(n.aborted) }) }

func (n *Node) call(ctx context.Context, id string, req hub.CallRequest) (*mcpclient.Result, error) {
	// The node serving the call, for its errors: the view's holder of the
	// device until a reply names it.
	node := hub.RoutedTo(ctx)
	msg := callMsg{ID: nuid.Next(), Node: n.cfg.NodeID, Device: id, Tool: req.Tool, Arguments: req.Arguments,
		TimeoutMS: req.Timeout.Milliseconds(), Caller: req.Caller, Door: req.Door, Meta: req.Meta,
		Progress: req.OnProgress != nil, SharedReply: true, ReportSend: req.OnSend != nil && n.reportsSend(node)}
	if err := n.reachable(); err != nil {
		return nil, hub.NotSentError(fmt.Errorf("%w: %s: %w", hub.ErrDeviceOffline, id, err))
	}
	select {
	case <-n.aborted:
		return nil, hub.NotSentError(fmt.Errorf("%w: %s: this node (%s) is stopping", hub.ErrDeviceOffline, id, n.cfg.NodeID))
	default:
	}
	// OnSend runs when the serving node is about to send the call, after
	// its own waits (the device's rate, a call slot); a node of an older
	// version, or one unknown yet, would not say when: it runs now.
	onSend := req.OnSend
	if onSend != nil && !msg.ReportSend {
		if err := onSend(); err != nil {
			return nil, hub.NotSentError(err)
		}
		onSend = nil
	}
	inbox, replies, done, err := n.expect(msg.ID)
	if err != nil {
		return nil, hub.NotSentError(fmt.Errorf("%w: cluster: %w", hub.ErrDeviceOffline, err))
	}
	defer done()
	buf := getBuf()
	*buf = appendCall(*buf, &msg)
	size := len(*buf)
	err = n.nc.PublishRequest(n.callSubject(id), inbox, *buf)
	putBuf(buf)
	if errors.Is(err, nats.ErrMaxPayload) {
		return nil, hub.NotSentError(fmt.Errorf("cluster: the call (%d bytes) is larger than NATS carries between nodes (%d bytes): %w", size, n.nc.MaxPayload(), err))
	}
	if err != nil {
		return nil, hub.NotSentError(fmt.Errorf("%w: cluster: %w", hub.ErrDeviceOffline, err))
	}
	lost := n.natsLost.Load()
	quiet := time.NewTimer(n.cfg.silence)
	defer quiet.Stop()
	// The serving node times the call out itself; this is for a node that
	// cannot (frozen, overloaded) and yet sends keepalives late.
	var deadline <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout + timeoutGrace)
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-ctx.Done():
			n.cancelCall(msg.ID)
			return nil, ctx.Err()
		case <-n.aborted:
			n.cancelCall(msg.ID)
			return nil, fmt.Errorf("%w: %s: this node (%s) is stopping", hub.ErrDeviceDisconnected, id, n.cfg.NodeID)
		case <-deadline:
			n.cancelCall(msg.ID)
			return nil, fmt.Errorf("%w: %s did not answer within the call's timeout (%s)", hub.ErrDeviceTimeout, servingNode(node, id), req.Timeout)
		case <-quiet.C:
			// Given up: should the serving node be merely slow, its
			// call ends too.
			n.cancelCall(msg.ID)
			if n.natsLost.Load() != lost || !n.nc.IsConnected() {
				// Not the serving node's fault, as far as this node knows.
				return nil, fmt.Errorf("%w: this node (%s) lost its NATS connection during the call; no answer for %s",
					hub.ErrDeviceDisconnected, n.cfg.NodeID, n.cfg.silence)
			}
			return nil, fmt.Errorf("%w: %s went silent for %s", hub.ErrDeviceDisconnected, servingNode(node, id), n.cfg.silence)
		case m := <-replies:
			if m.Header.Get("Status") == "503" { // NATS: no responders
				return nil, hub.NotSentError(fmt.Errorf("%w: %s (connected to no node)", hub.ErrDeviceOffline, id))
			}
			var r replyMsg
			if err := decodeReply(m.Data, &r); err != nil {
				return nil, fmt.Errorf("%w: cluster: bad reply: %w", mcpclient.ErrMalformedResponse, err)
			}
			if r.Node != "" {
				// Known before the result: a call that ends without one
				// (the node died) is audited with the node that ran it.
				hub.ServedBy(ctx, r.Node)
				node = r.Node
			}
			switch r.Kind {
			case kindProgress:
				if req.OnProgress != nil {
					req.OnProgress(r.Progress)
				}
			case kindSend:
				if onSend == nil || m.Reply == "" {
					break // said twice, or not asked for
				}
				err := onSend()
				onSend = nil
				var why []byte
				if err != nil {
					why = []byte(err.Error())
				}
				if rerr := m.Respond(why); rerr != nil && err == nil {
					// Unconfirmed, the serving node sends nothing: its
					// result says so (not sent), after OnSend ran.
					n.log.Warn("cluster: confirming a routed call's send", "error", rerr)
				}
				if err != nil {
					return nil, hub.NotSentError(err)
				}
			case kindResult:
				if onSend != nil && !(r.Code != "" && r.NotSent) {
					// Sent by a node that did not say so (one of an older
					// version the device moved to meanwhile): OnSend runs
					// late, so that the call's end is recorded.
					if err := onSend(); err != nil {
						n.log.Warn("cluster: a routed call was sent without its send reported", "device_id", id, "node", node, "error", err)
					}
				}
				if r.Code != "" {
					return nil, remoteError(r)
				}
				if r.Result == nil {
					return nil, fmt.Errorf("%w: cluster: reply without a result", mcpclient.ErrMalformedResponse)
				}
				return r.Result, nil
			}
			quiet.Reset(n.cfg.silence)
		}
	}
}

// servingNode names the node serving a call to device id, for an error.
func servingNode(node, id string) string {
	if node == "" {
		return "the node serving " + id
	}
	return "node " + node + " serving " + id
}

// timeoutGrace is how long past a call's timeout its caller waits for the
// serving node's own answer (device_timeout, or a result just in time).
const timeoutGrace = time.Second

// cancelCall tells every node that call id is cancelled: the one serving
// it ends it, the others keep it in case the call is still on its way.
func (n *Node) cancelCall(id string) {
	b, _ := json.Marshal(cancelMsg{Call: id})
	_ = n.nc.Publish(n.subject("cancel"), b)
}

// codes maps hub.Code slugs back to the sentinels they came from.
var codes = map[string]error{
	"device_not_found":    hub.ErrDeviceNotFound,
	"tool_not_found":      hub.ErrToolNotFound,
	"invalid_arguments":   hub.ErrInvalidArgs,
	"device_offline":      hub.ErrDeviceOffline,
	"device_timeout":      hub.ErrDeviceTimeout,
	"device_disconnected": hub.ErrDeviceDisconnected,
	"device_busy":         hub.ErrDeviceBusy,
	"rate_limited":        hub.ErrRateLimited,
	"device_bad_response": mcpclient.ErrMalformedResponse,
	"client_closed":       context.Canceled,
}

// wireError is a gateway error from another node: its message as sent,
// matching the sentinel of its code with errors.Is.
type wireError struct {
	msg string
	err error
}

func (e *wireError) Error() string { return e.msg }
func (e *wireError) Unwrap() error { return e.err }

// remoteError rebuilds the error a serving node sent, so that doors map it
// exactly as a local one.
func remoteError(r replyMsg) error {
	var err error
	sentinel := codes[r.Code]
	switch {
	case r.Code == "invalid_arguments" && len(r.Problems) > 0:
		err = &hub.ValidationError{Tool: r.Tool, Problems: r.Problems}
	case r.Code == "device_busy" || r.Code == "rate_limited":
		msg := r.Error
		if prefix := sentinel.Error() + ": "; len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
			msg = msg[len(prefix):]
		}
		err = &hub.LimitError{Err: sentinel, Limit: r.Limit, RetryAfter: time.Duration(r.RetryAfterMS) * time.Millisecond, Msg: msg}
	case sentinel != nil:
		err = &wireError{msg: r.Error, err: sentinel}
	default:
		err = errors.New(r.Error)
	}
	if r.NotSent {
		err = hub.NotSentError(err)
	}
	return err
}

// onCall serves a call routed to this node, on a server goroutine.
func (n *Node) onCall(m *nats.Msg) {
	if m.Reply == "" || n.answerProbe(m) {
		return
	}
	n.serve(m.Reply, m.Data)
}

func (n *Node) serve(subject string, data []byte) {
	var msg callMsg
	if err := decodeCall(data, &msg); err != nil {
		n.answer(replyTo{subject: subject}, replyMsg{Kind: kindResult, Code: "bad_request", Error: "cluster: bad call: " + err.Error()})
		return
	}
	reply := replyTo{subject: subject}
	if msg.SharedReply {
		reply = sharedReplyTo(subject, msg.ID)
	}
	n.mu.Lock()
	if n.wasCancelled(msg.ID) {
		n.mu.Unlock()
		n.metrics.count("served", nil, context.Canceled)
		n.answer(reply, replyMsg{Kind: kindResult, Code: "client_closed", Error: "cluster: the call was cancelled before it was served", NotSent: true})
		return
	}
	h := n.hub
	ctx, cancel := context.WithCancel(n.ctx)
	n.calls[msg.ID] = cancel
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.calls, msg.ID)
		n.mu.Unlock()
		cancel()
	}()
	if h == nil {
		n.answer(reply, replyMsg{Kind: kindResult, Code: "device_offline", Error: hub.ErrDeviceOffline.Error(), NotSent: true})
		return
	}
	n.fast.serving(msg.ID, reply)
	defer n.fast.served(msg.ID)
	req := hub.CallRequest{Device: msg.Device, Tool: msg.Tool, Arguments: msg.Arguments,
		Timeout: time.Duration(msg.TimeoutMS) * time.Millisecond, Caller: msg.Caller, Door: msg.Door, Meta: msg.Meta}
	if msg.Progress {
		req.OnProgress = func(p json.RawMessage) {
			n.answer(reply, replyMsg{Kind: kindProgress, Node: n.cfg.NodeID, Progress: p})
		}
	}
	if msg.ReportSend {
		req.OnSend = func() error { return n.confirmSend(ctx, reply, msg.Node) }
	}
	res, err := h.ServeRemote(ctx, req)
	if err != nil && n.ctx.Err() != nil {
		// Cut by this node's stop, not by its caller: the caller's device
		// went away with the node.
		err = fmt.Errorf("%w: node %s stopped during the call: %w", hub.ErrDeviceDisconnected, n.cfg.NodeID, err)
	}
	n.metrics.count("served", res, err)
	r := replyMsg{Kind: kindResult, Node: n.cfg.NodeID, Result: res}
	if err != nil {
		r.Result = nil
		r.Code, r.Error, r.NotSent = hub.Code(err), err.Error(), hub.NotSent(err)
		var le *hub.LimitError
		if errors.As(err, &le) {
			r.Limit, r.RetryAfterMS = le.Limit, le.RetryAfter.Milliseconds()
		}
		var ve *hub.ValidationError
		if errors.As(err, &ve) {
			r.Tool, r.Problems = ve.Tool, ve.Problems
		}
	}
	n.answer(reply, r)
}

// confirmSend tells the taking node, node, that a call it routed here with
// ReportSend is about to be sent to the device, and waits for it to confirm:
// an error, the taking node's or none in time, ends the call unsent.
func (n *Node) confirmSend(ctx context.Context, reply replyTo, node string) error {
	ctx, cancel := context.WithTimeout(ctx, sendConfirmWait)
	defer cancel()
	m, err := n.nc.RequestWithContext(ctx, reply.subject, appendReply(nil, reply.id, &replyMsg{Kind: kindSend, Node: n.cfg.NodeID}))
	switch {
	case err != nil:
		return fmt.Errorf("cluster: node %s, which took the call, did not confirm sending it: %w", node, err)
	case len(m.Data) > 0:
		return fmt.Errorf("cluster: node %s, which took the call, refused to send it: %s", node, m.Data)
	}
	return nil
}

// reportsSend reports whether node, a live member, says when it sends a
// routed call to the device (roleReportsSend).
func (n *Node) reportsSend(node string) bool {
	return node != "" && slices.Contains(n.MembersWith(roleReportsSend), node)
}

func (n *Node) answer(reply replyTo, r replyMsg) {
	buf := getBuf()
	*buf = appendReply(*buf, reply.id, &r)
	size := len(*buf)
	err := n.nc.Publish(reply.subject, *buf)
	putBuf(buf)
	if errors.Is(err, nats.ErrMaxPayload) && r.Kind == kindResult {
		// Said at once: the caller would otherwise wait for a result
		// that never comes, and report the node silent.
		n.log.Warn("cluster: a call's result is too large to cross nodes", "bytes", size, "max_payload", n.nc.MaxPayload())
		err = n.nc.Publish(reply.subject, appendReply(nil, reply.id, &replyMsg{Kind: kindResult, Node: n.cfg.NodeID, Code: "internal",
			Error: fmt.Sprintf("cluster: the result (%d bytes) is larger than NATS carries between nodes (%d bytes): call the device through node %s, which holds it, or raise NATS's max_payload",
				size, n.nc.MaxPayload(), n.cfg.NodeID)}))
	}
	if err != nil {
		n.log.Warn("cluster: sending a reply", "error", err)
	}
}
