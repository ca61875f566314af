package cluster

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// The routed call's wire format (docs/cluster.md, "Performance"): a call
// and its replies are binary, not JSON. The arguments, the progress and the
// result's content items travel as the bytes they are, neither quoted nor
// scanned again; the small fields are length-prefixed strings. A decoded
// message's byte fields alias the NATS message's data, which nats.go
// allocates for each message and never reuses.
//
// Layout, after the version byte wireV1 (JSON starts with '{', so a
// message of another format is told apart):
//
//	call:  flags(progress, shared reply, report send) uvarint(timeout ms) str(id) str(node)
//	       str(device) str(tool) str(caller) str(door) bytes(meta) bytes(arguments)
//	reply: kind str(node), then
//	       progress: bytes(progress)
//	       send:     nothing more (the call is about to be sent: the taking
//	                 node answers the message's NATS reply subject)
//	       result:   flags(is error, gateway error)
//	                 gateway error: str(code) str(error) str(limit)
//	                   uvarint(retry after ms) str(tool) bytes(problems as JSON)
//	                 else: uvarint(n) n×bytes(content) bytes(structured) bytes(meta)
//
// A reply to a call flagged shared reply goes to the caller's shared reply
// subject (fast.go) with the version byte wireV2 and str(call id) before
// the same layout; the other replies are wireV1.
//
// str and bytes are a uvarint length and as many bytes. Like the JSON
// reply before it, a result does not carry the device's JSON-RPC error
// (Result.RPCError): its text is in the content.
const (
	wireV1 = 1
	wireV2 = 2
)

const (
	wireKindProgress = 1
	wireKindAlive    = 2
	wireKindResult   = 3
	wireKindSend     = 4

	flagProgress    = 1 << 0 // call: the caller wants progress
	flagSharedReply = 1 << 1 // call: reply on the shared reply subject, the id first
	flagReportSend  = 1 << 2 // call: say when it is about to be sent (kindSend); older nodes ignore it
	flagIsError     = 1 << 0 // result: Result.IsError
	flagGateway     = 1 << 1 // result: a gateway error, not a result
	flagNotSent     = 1 << 2 // result: the gateway error's call was not sent
)

var errShortWire = errors.New("truncated message")

// bufPool holds encoding buffers: NATS copies a message into its write
// buffer before Publish returns, so a buffer serves call after call.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // a big result's buffer: let it go
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

func appendStr(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendBytes(b, s []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendCall encodes msg after b.
func appendCall(b []byte, msg *callMsg) []byte {
	var flags byte
	if msg.Progress {
		flags |= flagProgress
	}
	if msg.SharedReply {
		flags |= flagSharedReply
	}
	if msg.ReportSend {
		flags |= flagReportSend
	}
	b = append(b, wireV1, flags)
	b = binary.AppendUvarint(b, uint64(max(msg.TimeoutMS, 0)))
	b = appendStr(b, msg.ID)
	b = appendStr(b, msg.Node)
	b = appendStr(b, msg.Device)
	b = appendStr(b, msg.Tool)
	b = appendStr(b, msg.Caller)
	b = appendStr(b, msg.Door)
	b = appendBytes(b, msg.Meta)
	return appendBytes(b, msg.Arguments)
}

// appendReply encodes r after b: the reply to call id on its caller's
// shared reply subject, or with no id on the call's own reply subject.
func appendReply(b []byte, id string, r *replyMsg) []byte {
	if id != "" {
		b = appendStr(append(b, wireV2), id)
	} else {
		b = append(b, wireV1)
	}
	switch r.Kind {
	case kindProgress:
		b = appendStr(append(b, wireKindProgress), r.Node)
		return appendBytes(b, r.Progress)
	case kindAlive:
		return appendStr(append(b, wireKindAlive), r.Node)
	case kindSend:
		return appendStr(append(b, wireKindSend), r.Node)
	}
	b = appendStr(append(b, wireKindResult), r.Node)
	var flags byte
	if r.NotSent {
		flags |= flagNotSent
	}
	if r.Code != "" {
		var problems []byte
		if len(r.Problems) > 0 {
			problems, _ = json.Marshal(r.Problems) // strings only: cannot fail
		}
		b = append(b, flags|flagGateway)
		b = appendStr(b, r.Code)
		b = appendStr(b, r.Error)
		b = appendStr(b, r.Limit)
		b = binary.AppendUvarint(b, uint64(max(r.RetryAfterMS, 0)))
		b = appendStr(b, r.Tool)
		return appendBytes(b, problems)
	}
	res := r.Result
	if res == nil {
		res = &mcpclient.Result{}
	}
	if res.IsError {
		flags |= flagIsError
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(res.Content)))
	for _, c := range res.Content {
		b = appendBytes(b, c)
	}
	b = appendBytes(b, res.StructuredContent)
	return appendBytes(b, res.Meta)
}

// wireReader reads the fields of a binary message; the first error sticks.
type wireReader struct {
	b   []byte
	err error
}

func (r *wireReader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errShortWire
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *wireReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShortWire
		return 0
	}
	r.b = r.b[n:]
	return v
}

// bytes returns the next field, aliasing the message; nil when empty.
func (r *wireReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errShortWire
		return nil
	}
	if n == 0 {
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *wireReader) str() string { return string(r.bytes()) }

// decodeCall reads a call, binary or (from a node of an older version) JSON.
func decodeCall(data []byte, msg *callMsg) error {
	if len(data) > 0 && data[0] == '{' {
		return json.Unmarshal(data, msg)
	}
	r := wireReader{b: data}
	if v := r.byte(); r.err == nil && v != wireV1 {
		return errors.New("unknown call format")
	}
	flags := r.byte()
	*msg = callMsg{Progress: flags&flagProgress != 0, SharedReply: flags&flagSharedReply != 0, ReportSend: flags&flagReportSend != 0,
		TimeoutMS: int64(r.uvarint())}
	msg.ID, msg.Node, msg.Device, msg.Tool = r.str(), r.str(), r.str(), r.str()
	msg.Caller, msg.Door = r.str(), r.str()
	msg.Meta, msg.Arguments = r.bytes(), r.bytes()
	return r.err
}

// replyCallID returns the call id a wireV2 reply starts with, aliasing
// data.
func replyCallID(data []byte) ([]byte, bool) {
	r := wireReader{b: data}
	if r.byte() != wireV2 {
		return nil, false
	}
	id := r.bytes()
	return id, r.err == nil && len(id) > 0
}

// decodeReply reads a reply, binary or (from a node of an older version)
// JSON.
func decodeReply(data []byte, msg *replyMsg) error {
	if len(data) > 0 && data[0] == '{' {
		return json.Unmarshal(data, msg)
	}
	r := wireReader{b: data}
	switch v := r.byte(); {
	case r.err != nil, v == wireV1:
	case v == wireV2:
		r.bytes() // the call's id, read by replyCallID
	default:
		return errors.New("unknown reply format")
	}
	kind := r.byte()
	*msg = replyMsg{Node: r.str()}
	switch kind {
	case wireKindProgress:
		msg.Kind, msg.Progress = kindProgress, r.bytes()
		return r.err
	case wireKindAlive:
		msg.Kind = kindAlive
		return r.err
	case wireKindSend:
		msg.Kind = kindSend
		return r.err
	case wireKindResult:
		msg.Kind = kindResult
	default:
		if r.err != nil {
			return r.err
		}
		return errors.New("unknown reply kind")
	}
	flags := r.byte()
	msg.NotSent = flags&flagNotSent != 0
	if flags&flagGateway != 0 {
		msg.Code, msg.Error, msg.Limit = r.str(), r.str(), r.str()
		msg.RetryAfterMS = int64(r.uvarint())
		msg.Tool = r.str()
		if p := r.bytes(); len(p) > 0 && r.err == nil {
			var problems []hub.Problem
			if err := json.Unmarshal(p, &problems); err != nil {
				return err
			}
			msg.Problems = problems
		}
		return r.err
	}
	n := r.uvarint()
	if n > uint64(len(r.b)) { // each item takes a byte at least
		return errShortWire
	}
	res := &mcpclient.Result{IsError: flags&flagIsError != 0, Content: make([]json.RawMessage, n)}
	for i := range res.Content {
		res.Content[i] = r.bytes()
	}
	res.StructuredContent, res.Meta = r.bytes(), r.bytes()
	msg.Result = res
	return r.err
}
