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
