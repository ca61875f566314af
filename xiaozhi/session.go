package xiaozhi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
)

// NewSessionID returns a fresh session id in the UUID (version 4) form the
// ecosystem's servers hand out in their hello.
func NewSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Goodbye ends a device's audio session; firmware honours one without a
// session_id or with its own.
type Goodbye struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
}

// NoAudioMessage is what a device shows when a gateway without audio refuses
// its audio session (MQTT) or a listen (WebSocket).
const NoAudioMessage = "This gateway carries no audio: voice is unavailable, device tools still work."

// AudioRefusal returns the two messages a gateway without audio answers an
// audio hello with (MQTT): an alert that says why, then a goodbye that closes
// the audio channel. Both echo sessionID (which may be empty); MCP goes on.
func AudioRefusal(sessionID string) (alert, goodbye []byte) {
	// Marshalling these structs of strings cannot fail.
	goodbye, _ = json.Marshal(Goodbye{Type: TypeGoodbye, SessionID: sessionID})
	return noAudioAlert(sessionID), goodbye
}

// TTS is a server message about the server's speech. Firmware turns to
// speaking on state "start"; on "stop" it goes idle if the listen was manual
// (push to talk) and listens again otherwise.
type TTS struct {
	Type      string `json:"type"`
	SessionID string `json:"session_id,omitempty"`
	State     string `json:"state"`
	Text      string `json:"text,omitempty"`
}

// States of a TTS message.
const (
	TTSStart = "start"
	TTSStop  = "stop"
)

// ListenRefusal returns the messages a gateway without audio answers a
// WebSocket device that starts listening with: the alert of [AudioRefusal],
// then an empty answer (tts start, tts stop) that ends the listen as a spoken
// answer would. A WebSocket device ignores a server goodbye (it closes the
// socket itself), so none is sent; the socket and MCP go on. All echo
// sessionID (which may be empty).
func ListenRefusal(sessionID string) [][]byte {
	start, _ := json.Marshal(TTS{Type: TypeTTS, SessionID: sessionID, State: TTSStart})
	stop, _ := json.Marshal(TTS{Type: TypeTTS, SessionID: sessionID, State: TTSStop})
	return [][]byte{noAudioAlert(sessionID), start, stop}
}

func noAudioAlert(sessionID string) []byte {
	b, _ := json.Marshal(Alert{Type: TypeAlert, SessionID: sessionID, Status: "error", Message: NoAudioMessage, Emotion: "sad"})
	return b
}
