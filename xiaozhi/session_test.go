package xiaozhi

import (
	"encoding/json"
	"regexp"
	"testing"
)

func TestNewSessionID(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := NewSessionID(), NewSessionID()
	if !uuid.MatchString(a) || a == b {
		t.Fatalf("ids %q %q: want distinct version-4 UUIDs", a, b)
	}
}

func TestAudioRefusal(t *testing.T) {
	for _, sid := range []string{"5a1595ab", ""} {
		alert, bye := AudioRefusal(sid)
		var a Alert
		var g Goodbye
		if err := json.Unmarshal(alert, &a); err != nil || a.Type != TypeAlert || a.SessionID != sid || a.Message != NoAudioMessage || a.Status == "" {
			t.Errorf("alert %s: %+v %v", alert, a, err)
		}
		if err := json.Unmarshal(bye, &g); err != nil || g.Type != TypeGoodbye || g.SessionID != sid {
			t.Errorf("goodbye %s: %+v %v", bye, g, err)
		}
		if sid == "" && string(bye) != `{"type":"goodbye"}` {
			t.Errorf("goodbye without a session: %s", bye)
		}
	}
}

func TestListenRefusal(t *testing.T) {
	msgs := ListenRefusal("5a1595ab")
	want := []string{
		`{"type":"alert","session_id":"5a1595ab","status":"error","message":"` + NoAudioMessage + `","emotion":"sad"}`,
		`{"type":"tts","session_id":"5a1595ab","state":"start"}`,
		`{"type":"tts","session_id":"5a1595ab","state":"stop"}`,
	}
	if len(msgs) != len(want) {
		t.Fatalf("got %d messages, want %d", len(msgs), len(want))
	}
	for i, m := range msgs {
		if string(m) != want[i] {
			t.Errorf("message %d = %s, want %s", i, m, want[i])
		}
	}
	if alert, _ := AudioRefusal("5a1595ab"); string(alert) != want[0] {
		t.Errorf("MQTT alert %s differs from the WebSocket one %s", alert, want[0])
	}
}
