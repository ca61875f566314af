package gateway

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// A gateway that cannot start (a port taken, the most common mistake)
// returns its error at once: Run used to wait for the queued-call worker,
// which only a cancelled ctx ended, so serve hung with the error unshown.
func TestRunReturnsStartErrors(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"HTTP address taken", Config{Addr: addr}},
		{"MQTT address taken", Config{Addr: "127.0.0.1:0", MQTTAddr: addr}},
		{"debug address taken", Config{Addr: "127.0.0.1:0", DebugAddr: addr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir = t.TempDir()
			gw, err := New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- gw.Run(context.Background()) }() // never cancelled, as serve's until a signal
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "address already in use") {
					t.Fatalf("Run = %v, want the port's error", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return its start error within 30 s")
			}
		})
	}
}
