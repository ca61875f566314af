package cluster

import (
	"reflect"
	"testing"
)

// Bytes from another node never panic the decoder, and what decodes
// encodes back to a message that decodes the same.
func FuzzWireDecode(f *testing.F) {
	f.Add(appendCall(nil, &wireCall))
	f.Add(appendReply(nil, "", &wireResult))
	f.Add(appendReply(nil, wireCall.ID, &wireResult))
	f.Add([]byte(`{"id":"x","device":"d","tool":"t"}`))
	f.Add([]byte{wireV1, wireKindResult, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var call callMsg
		if decodeCall(data, &call) == nil {
			var again callMsg
			if err := decodeCall(appendCall(nil, &call), &again); err != nil || !reflect.DeepEqual(normCall(again), normCall(call)) {
				t.Errorf("call %+v re-encoded decodes as %+v, %v", call, again, err)
			}
		}
		var reply replyMsg
		_ = decodeReply(data, &reply)
		_, _ = replyCallID(data)
	})
}

// normCall makes empty and absent byte fields alike: the binary format does
// not tell them apart.
func normCall(m callMsg) callMsg {
	if len(m.Arguments) == 0 {
		m.Arguments = nil
	}
	if len(m.Meta) == 0 {
		m.Meta = nil
	}
	if m.TimeoutMS < 0 {
		m.TimeoutMS = 0
	}
	return m
}
