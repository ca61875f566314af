package ws_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// A device that sends its hello in the same packet as the upgrade request
// (before reading the 101) must not lose it: the bytes the HTTP server read
// ahead are handed over to the WebSocket reader.
func TestHelloInSamePacketAsUpgrade(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	conn, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello := `{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket"}`
	req := "GET /xiaozhi/v1/ HTTP/1.1\r\nHost: " + s.addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nDevice-Id: 02:00:00:00:0e:01\r\n\r\n"
	if _, err := conn.Write(append([]byte(req), maskedText(hello)...)); err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	// The server hello comes back: the early hello was not lost.
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, head[1]&0x7f)
	if head[1]&0x7f == 126 {
		var ext [2]byte
		io.ReadFull(br, ext[:])
		payload = make([]byte, binary.BigEndian.Uint16(ext[:]))
	}
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(payload), `"type":"hello"`) || !strings.Contains(string(payload), `"transport":"websocket"`) {
		t.Fatalf("first frame = %s", payload)
	}
	waitState(t, s.hub, "02:00:00:00:0e:01", hub.StateDiscovering)
}

// maskedText encodes one client text frame (clients must mask).
func maskedText(s string) []byte {
	key := [4]byte{1, 2, 3, 4}
	out := []byte{0x81, 0x80 | byte(len(s))}
	out = append(out, key[:]...)
	for i := range len(s) {
		out = append(out, s[i]^key[i%4])
	}
	return out
}
