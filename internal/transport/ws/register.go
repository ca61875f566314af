package ws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/coder/websocket"

	"github.com/mcpgate/mcpgate/internal/dialect/register"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/transport/conns"
	"github.com/mcpgate/mcpgate/jsonrpc"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// This file serves the registration dialect (internal/dialect/register) on
// the same path: a connection whose first text frame is an mcp/registerTools
// request instead of a hello. Frames are plain JSON-RPC, with no envelope;
// the device names itself with mac_addr (a Device-Id header is optional and,
// when sent, must name the same device). The connection has the same
// lifecycle as a XiaoZhi one: one reader, keepalive pings from a timer, the
// socket closed from a context.AfterFunc when the session ends.

// errNoIdentity refuses a hello on a connection that named no device: only
// the registration dialect may leave Device-Id out.
var errNoIdentity = errors.New("missing device identity: send a Device-Id header (or a device-id query parameter)")

// JSON-RPC codes of refused registrations, in the server-defined range.
const (
	codeUnauthorized jsonrpc.Code = -32001
	codeWrongDevice  jsonrpc.Code = -32002
)

// registrationError is a registration refused as a whole.
type registrationError struct {
	code   jsonrpc.Code
	result string // the handshake metric's result label
	err    error
}

func (e *registrationError) Error() string { return e.err.Error() }
func (e *registrationError) Unwrap() error { return e.err }

// serveRegister serves a registration-dialect connection until it ends.
// first is the mcp/registerTools frame that opened it.
func (c *connection) serveRegister(first []byte) {
	msg, err := jsonrpc.Decode(first)
	if err != nil { // IsRegistration decoded it already
		c.conn.CloseNow()
		return
	}
	reg, rerr := c.decodeRegistration(msg.Params, "")
	if rerr == nil {
		rerr = c.authenticateRegistration(reg)
	}
	if rerr != nil {
		c.t.m.Handshakes.WithLabelValues("websocket", rerr.result).Inc()
		c.log.Info("device registration refused", "device_id", c.id.deviceID, "remote", c.remote, "error", rerr)
		c.writeFrame(register.ErrorReply(msg.ID, rerr.code, rerr.Error()))
		c.conn.Close(websocket.StatusPolicyViolation, conns.CloseReason(rerr))
		return
	}
	c.id.deviceID = reg.DeviceID
	c.sessionID = xiaozhi.NewSessionID()
	c.log = c.log.With("device_id", c.id.deviceID, "session_id", c.sessionID, "remote", c.remote, "dialect", hub.KindRegister)
	c.t.m.Handshakes.WithLabelValues("websocket", "ok").Inc()

	scfg := c.t.cfg.Session
	scfg.Logger = c.log
	scfg.Vision = nil // no initialize: nothing would carry it
	c.sess = mcpclient.New(c.t.conns.Context(), register.NewLink(c.writeText), scfg)
	att := c.t.cfg.Hub.Attach(hub.ConnInfo{
		DeviceID: c.id.deviceID, ClientID: c.id.clientID, Kind: hub.KindRegister, Transport: "websocket",
		SessionID: c.sessionID, Remote: c.remote, ProtocolVersion: c.id.protoVer, Logger: c.log,
	}, c.sess)
	c.att.Store(att)
	c.log.Info("device connected", "mac_addr", reg.MAC, "client_id", c.id.clientID) // c.log names the dialect
	finish := c.startRegister()
	c.applyRegistration(att, msg.ID, reg)
	c.sess.Close(c.readRegister())
	finish()
}

// decodeRegistration decodes a registration's params; want, when set, is
// the device id the connection already has.
func (c *connection) decodeRegistration(params json.RawMessage, want string) (*register.Registration, *registrationError) {
	reg, err := register.Decode(params, register.Options{MaxTools: c.t.cfg.Session.MaxTools, CheckSchema: hub.CheckSchema})
	if err != nil {
		return nil, &registrationError{code: jsonrpc.CodeInvalidParams, result: "bad_registration", err: err}
	}
	if want == "" {
		want = c.id.deviceID // the Device-Id header, when sent
	}
	if want != "" && reg.DeviceID != want {
		return nil, &registrationError{code: codeWrongDevice, result: "bad_identity",
			err: fmt.Errorf("mac_addr %q is device %s, but this connection is device %s", reg.MAC, reg.DeviceID, want)}
	}
	if err := c.t.cfg.Hub.CheckNewID(reg.DeviceID); err != nil {
		return nil, &registrationError{code: jsonrpc.CodeInvalidParams, result: "bad_identity", err: err}
	}
	return reg, nil
}

// authenticateRegistration checks the credentials of a device that sent no
// Device-Id header: the upgrade could not, not knowing who it was.
func (c *connection) authenticateRegistration(reg *register.Registration) *registrationError {
	if c.t.cfg.Authenticate == nil || c.id.deviceID != "" {
		return nil
	}
	if err := c.t.cfg.Authenticate(reg.DeviceID, c.id.clientID, c.id.token); err != nil {
		return &registrationError{code: codeUnauthorized, result: "unauthorized", err: fmt.Errorf("device authentication failed: %w", err)}
	}
	return nil
}

// applyRegistration records an accepted registration's tools and answers it:
// the ack, or an error listing the rejected tools (the rest are registered).
// The catalog is recorded before the answer, so a device that has its ack
// can be called at once.
func (c *connection) applyRegistration(att *hub.Attachment, id jsonrpc.ID, reg *register.Registration) {
	att.Register(reg.Tools)
	if len(reg.Rejected) > 0 {
		c.log.Warn("device registration rejected tools", "registered", len(reg.Tools), "rejected", len(reg.Rejected),
			"first_rejection", reg.Rejected[0].Reason)
		c.writeFrame(register.RejectedError(id, reg))
		return
	}
	c.log.Debug("device registered tools", "tools", len(reg.Tools))
	c.writeFrame(register.Ack(id, len(reg.Tools)))
}

// startRegister sets up what start does for a XiaoZhi connection but
// discovery: the closer and keepalive. The returned func tears them down
// once the reader has ended.
func (c *connection) startRegister() (finish func()) {
	sess, att := c.sess, c.att.Load()
	closed := make(chan struct{})
	stopCloser := context.AfterFunc(sess.Context(), func() {
		defer close(closed)
		c.close(context.Cause(sess.Context()))
	})
	stopKeepalive := c.startKeepalive(c.ctx, sess)
	return func() {
		if !stopCloser() {
			<-closed
		}
		stopKeepalive()
		att.Detach()
	}
}

// readRegister reads every frame until the connection ends and returns why.
func (c *connection) readRegister() error {
	for {
		typ, data, err := c.conn.Read(c.ctx)
		if err != nil {
			return c.readError(err)
		}
		c.att.Load().Touch()
		if typ == websocket.MessageBinary {
			c.t.m.DroppedFrames.WithLabelValues("audio").Inc()
			continue
		}
		c.registerFrame(data)
	}
}

// registerFrame handles one text frame: a re-registration, a reply to a
// tool call, or anything else (answered or dropped).
func (c *connection) registerFrame(data []byte) {
	msg, err := jsonrpc.Decode(data)
	if err != nil {
		c.t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
		c.unparseable.Warn(c.log, "dropped unparseable frame from device", "error", err, "frame", conns.Truncate(string(data), 300))
		return
	}
	switch msg.Kind() {
	case jsonrpc.KindResponse:
		payload, err := register.FromDevice(msg)
		if err != nil {
			c.t.m.DroppedFrames.WithLabelValues("unparseable").Inc()
			c.log.Warn("dropped reply the gateway cannot re-encode", "error", err, "id", msg.ID.String())
			return
		}
		c.sess.Handle(payload)
	case jsonrpc.KindRequest:
		if msg.Method != register.MethodRegister {
			c.writeFrame(register.ErrorReply(msg.ID, jsonrpc.CodeMethodNotFound, "Method not found: "+msg.Method))
			return
		}
		reg, rerr := c.decodeRegistration(msg.Params, c.id.deviceID)
		if rerr != nil {
			// The previous catalog stays; so does the connection.
			c.log.Info("device re-registration refused", "error", rerr)
			c.writeFrame(register.ErrorReply(msg.ID, rerr.code, rerr.Error()))
			return
		}
		c.applyRegistration(c.att.Load(), msg.ID, reg)
	default:
		c.log.Debug("ignored notification from device", "method", msg.Method)
	}
}

// writeText writes one frame; it is the dialect link's writer.
func (c *connection) writeText(ctx context.Context, frame []byte) error {
	return c.conn.Write(ctx, websocket.MessageText, frame)
}

// writeFrame writes a reply from the reader, within the write timeout.
func (c *connection) writeFrame(frame []byte) {
	ctx, cancel := context.WithTimeout(c.ctx, c.t.cfg.WriteTimeout)
	defer cancel()
	if err := c.writeText(ctx, frame); err != nil {
		c.log.Debug("could not write to device", "error", err)
	}
}
