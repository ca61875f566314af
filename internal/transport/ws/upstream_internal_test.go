package ws

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestReplacePath(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		frame, key, val, want string
	}{
		{`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"method":"x"}}`, "id", "1073741824",
			`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":1073741824,"method":"x"}}`},
		{`{"payload": { "id" : "a\"b" , "result":{"id":3}} ,"type":"mcp"}`, "id", `"a\"b"`,
			`{"payload": { "id" : "a\"b" , "result":{"id":3}} ,"type":"mcp"}`},
		{`{"type":"mcp","payload":{"id":1,"x":"<&>\u00e9","id":2}}`, "id", "9",
			`{"type":"mcp","payload":{"id":1,"x":"<&>\u00e9","id":9}}`},
	} {
		got, err := replacePath([]byte(tc.frame), []string{"payload", tc.key}, []byte(tc.val))
		if err != nil || string(got) != tc.want {
			t.Errorf("replace %s in %s: got %s, %v; want %s", tc.key, tc.frame, got, err, tc.want)
		}
	}
	for _, bad := range []string{`{"type":"mcp"}`, `{"payload":[1]}`, `[1]`, `{"payload":{"x":1}}`} {
		if _, err := replacePath([]byte(bad), []string{"payload", "id"}, []byte("1")); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// FuzzReplacePath: any frame either is refused or comes back valid JSON
// with the member replaced and every other member as it was.
func FuzzReplacePath(f *testing.F) {
	f.Add([]byte(`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"method":"x"}}`))
	f.Add([]byte(`{"payload":{"id":"a\"b","id":1}}`))
	f.Add([]byte(`{"payload":{"id":1},"payload":{"x":1}}`))
	f.Add([]byte(`{"payload":{"id":1}} trailing`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		out, err := replacePath(frame, []string{"payload", "id"}, []byte("1073741824"))
		if err != nil {
			return
		}
		var got struct {
			Payload map[string]json.RawMessage `json:"payload"`
		}
		if !json.Valid(out) || json.Unmarshal(out, &got) != nil {
			t.Fatalf("%q became invalid %q", frame, out)
		}
		if string(got.Payload["id"]) != "1073741824" {
			t.Fatalf("%q became %q: id %s", frame, out, got.Payload["id"])
		}
	})
}

// TestUpstreamHeaderForwardedFor: the upstream gets the peer as X-Real-IP,
// whatever the device claims, and every X-Forwarded-For line joined, the
// peer last.
func TestUpstreamHeaderForwardedFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		xff  []string
		want string
	}{
		{nil, "192.0.2.1"},
		{[]string{"10.0.0.1"}, "10.0.0.1, 192.0.2.1"},
		{[]string{"10.0.0.1", "10.0.0.2"}, "10.0.0.1, 10.0.0.2, 192.0.2.1"},
	} {
		r := httptest.NewRequest("GET", "/xiaozhi/v1/", nil)
		r.RemoteAddr = "192.0.2.1:4321"
		r.Header.Set("X-Real-IP", "6.6.6.6")
		for _, v := range tc.xff {
			r.Header.Add("X-Forwarded-For", v)
		}
		h := upstreamHeader(r)
		if got := h.Values("X-Forwarded-For"); len(got) != 1 || got[0] != tc.want || h.Get("X-Real-IP") != "192.0.2.1" {
			t.Errorf("X-Forwarded-For %q: upstream gets %q, X-Real-IP %q; want %q, 192.0.2.1", tc.xff, got, h.Get("X-Real-IP"), tc.want)
		}
	}
}

// FuzzAmbiguous: a valid frame ambiguous passes names each member the
// firmware reads at most once, in any case, in the envelope and in its
// payload (keys decoded by encoding/json, escapes undone).
func FuzzAmbiguous(f *testing.F) {
	f.Add([]byte(`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"method":"x"}}`))
	f.Add([]byte(`{"type":"mcp","payload":{"id":1,"ID":2},"type":"tts"}`))
	f.Add([]byte(`{"typ\u0065":"mcp","Type":"tts"}`))
	f.Add([]byte(`{"ſession_id":"a","session_id":"b"}`))
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !json.Valid(frame) || ambiguous(frame) {
			return
		}
		var env map[string]json.RawMessage
		if json.Unmarshal(frame, &env) != nil {
			return // not an object
		}
		if k := repeatedKey(frame, envelopeKeys); k != "" {
			t.Fatalf("%q passed with %q named twice", frame, k)
		}
		for key, v := range env {
			if strings.EqualFold(key, "payload") && len(v) > 0 && v[0] == '{' {
				if k := repeatedKey(v, payloadKeys); k != "" {
					t.Fatalf("%q passed with %q named twice in its payload", frame, k)
				}
			}
		}
	})
}

// repeatedKey returns the first of names the object obj (valid JSON) has
// twice, in any case.
func repeatedKey(obj []byte, names []string) string {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	count := map[string]int{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		key, _ := tok.(string)
		for _, n := range names {
			if strings.EqualFold(key, n) {
				if count[n]++; count[n] > 1 {
					return n
				}
			}
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}
