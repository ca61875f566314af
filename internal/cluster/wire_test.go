package cluster

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

var (
	wireCall = callMsg{ID: "Zx8nS0a9bQ1cD2eF3gH4iJ", Node: "node-2", Device: "esp32-kitchen-0042", Tool: "self.audio_speaker.set_volume",
		Arguments: json.RawMessage(`{"volume":42,"fade_ms":150}`), TimeoutMS: 30000, Caller: "key-agent-7", Door: "rest",
		Meta: json.RawMessage(`{"progressToken":"p-1"}`), Progress: true}
	wireResult = replyMsg{Kind: kindResult, Node: "node-1", Result: &mcpclient.Result{
		Content:           []json.RawMessage{json.RawMessage(`{"type":"text","text":"volume set to 42"}`)},
		StructuredContent: json.RawMessage(`{"volume":42}`)}}
)

// Every message survives the binary format as it did JSON.
func TestWireRoundTrip(t *testing.T) {
	for _, want := range []callMsg{wireCall, {ID: "a", Device: "d", Tool: "t", SharedReply: true, ReportSend: true}} {
		var call callMsg
		if err := decodeCall(appendCall(nil, &want), &call); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(call, want) {
			t.Errorf("call: got %+v, want %+v", call, want)
		}
	}
	replies := []replyMsg{
		wireResult,
		{Kind: kindResult, Node: "n1", Result: &mcpclient.Result{Content: []json.RawMessage{}, IsError: true, Meta: json.RawMessage(`{"a":1}`)}},
		{Kind: kindProgress, Progress: json.RawMessage(`{"progress":1,"total":3}`)},
		{Kind: kindAlive},
		{Kind: kindSend, Node: "n1"},
		{Kind: kindResult, Node: "n1", Code: "device_busy", Error: "device busy: 4 calls in flight", NotSent: true,
			Limit: "device_calls", RetryAfterMS: 250},
		{Kind: kindResult, Node: "n1", Code: "invalid_arguments", Error: "bad", Tool: "echo",
			Problems: []hub.Problem{{Path: "/volume", Message: "must be an integer"}}},
	}
	for _, want := range replies {
		for _, id := range []string{"", wireCall.ID} {
			b := appendReply(nil, id, &want)
			var got replyMsg
			if err := decodeReply(b, &got); err != nil {
				t.Fatalf("%+v: %v", want, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("reply: got %+v, want %+v", got, want)
			}
			if gotID, ok := replyCallID(b); string(gotID) != id || ok != (id != "") {
				t.Errorf("reply to call %q: its id read as %q, %v", id, gotID, ok)
			}
		}
	}
}

// A node of the previous version sends JSON: it is still read.
func TestWireReadsJSON(t *testing.T) {
	b, _ := json.Marshal(wireCall)
	var call callMsg
	if err := decodeCall(b, &call); err != nil || !reflect.DeepEqual(call, wireCall) {
		t.Errorf("call: %+v, %v", call, err)
	}
	b, _ = json.Marshal(wireResult)
	var r replyMsg
	if err := decodeReply(b, &r); err != nil || !reflect.DeepEqual(r, wireResult) {
		t.Errorf("reply: %+v, %v", r, err)
	}
}

// A truncated or garbled message is an error, never a panic.
func TestWireTruncated(t *testing.T) {
	call := appendCall(nil, &wireCall)
	for i := range len(call) {
		var m callMsg
		if decodeCall(call[:i], &m) == nil {
			t.Errorf("call cut at %d of %d decoded", i, len(call))
		}
	}
	for _, id := range []string{"", wireCall.ID} {
		reply := appendReply(nil, id, &wireResult)
		for i := range len(reply) {
			var m replyMsg
			if decodeReply(reply[:i], &m) == nil {
				t.Errorf("reply cut at %d of %d decoded", i, len(reply))
			}
			if gotID, ok := replyCallID(reply[:i]); ok && i < 2+len(id) {
				t.Errorf("reply cut at %d of %d: call id %q read", i, len(reply), gotID)
			}
		}
	}
	var m replyMsg
	if decodeReply([]byte{wireV1, wireKindResult, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, &m) == nil {
		t.Error("a reply claiming 4G content items decoded")
	}
}

// The encoding and decoding of one routed call and its reply, both nodes'
// share: JSON as before, and the binary format.
func BenchmarkWire(b *testing.B) {
	b.Run("call/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			data, _ := json.Marshal(wireCall)
			var m callMsg
			if err := json.Unmarshal(data, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("call/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf := getBuf()
			*buf = appendCall(*buf, &wireCall)
			var m callMsg
			err := decodeCall(*buf, &m)
			putBuf(buf)
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reply/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			data, _ := json.Marshal(wireResult)
			var m replyMsg
			if err := json.Unmarshal(data, &m); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reply/binary", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf := getBuf()
			*buf = appendReply(*buf, wireCall.ID, &wireResult)
			var m replyMsg
			err := decodeReply(*buf, &m)
			putBuf(buf)
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}
