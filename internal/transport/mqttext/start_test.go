package mqttext

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/freeport"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mosquittotest"
)

// A broker that cannot be reached fails Start when its context ends, and
// the error says why the attempts failed, not only that time ran out.
func TestStartSaysWhyTheBrokerIsUnreachable(t *testing.T) {
	tr, err := New(Config{Hub: hub.New(hub.Config{}), Broker: "tcp://" + freeport.Refused, Owns: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	err = tr.Start(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Start = %v, want the deadline and the last attempt's connection refused", err)
	}
}

// TestBrokerURLLogin: a login in the broker URL is the gateway's, unless
// --mqtt-broker-username gives one.
func TestBrokerURLLogin(t *testing.T) {
	for _, tc := range []struct{ broker, user, wantUser, wantPass string }{
		{"tcp://gw:secret@broker:1883", "", "gw", "secret"},
		{"tcp://gw@broker:1883", "", "gw", ""},
		{"tcp://gw:secret@broker:1883", "other", "other", ""},
		{"tcp://broker:1883", "", "", ""},
	} {
		tr, err := New(Config{Hub: hub.New(hub.Config{}), Broker: tc.broker, Username: tc.user})
		if err != nil {
			t.Fatal(err)
		}
		if tr.cfg.Username != tc.wantUser || tr.cfg.Password != tc.wantPass {
			t.Errorf("%s (username %q): login %q/%q, want %q/%q", tc.broker, tc.user, tr.cfg.Username, tr.cfg.Password, tc.wantUser, tc.wantPass)
		}
	}
}

// A broker that refuses the gateway's login fails Start at once, naming the
// CONNACK reason and the flags that set the login, instead of retrying
// until the start timeout.
func TestStartFailsAtOnceOnRefusedLogin(t *testing.T) {
	t.Parallel()
	b := mosquittotest.Start(t, "allow_anonymous false")
	tr, err := New(Config{Hub: hub.New(hub.Config{}), Broker: "tcp://gw:wrong@" + b.Addr})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err = tr.Start(ctx)
	if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "CONNACK 0x87 not authorized") ||
		!strings.Contains(err.Error(), "--mqtt-broker-password") {
		t.Fatalf("Start = %v, want the refusal named, with the login flags", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Start failed after %s, want at once", d)
	}
}
