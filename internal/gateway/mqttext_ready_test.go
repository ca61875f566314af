package gateway

import (
	"bytes"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// slowSubscribe makes a broker take its time over every SUBSCRIBE, as a
// loaded or distant broker does; subscribed counts the subscriptions it
// has let through.
type slowSubscribe struct {
	mochi.HookBase
	delay      time.Duration
	subscribed atomic.Int32
}

func (h *slowSubscribe) ID() string { return "slow-subscribe" }

func (h *slowSubscribe) Provides(b byte) bool {
	return bytes.Contains([]byte{mochi.OnSubscribe, mochi.OnSubscribed}, []byte{b})
}

func (h *slowSubscribe) OnSubscribe(_ *mochi.Client, pk packets.Packet) packets.Packet {
	time.Sleep(h.delay)
	return pk
}

func (h *slowSubscribe) OnSubscribed(*mochi.Client, packets.Packet, []byte) { h.subscribed.Add(1) }

// A gateway on an external broker is ready only once its uplink
// subscription is in place: a device that says hello the moment the
// gateway is ready must not be missed (it would wait for its hello
// timeout and reconnect).
func TestExternalBrokerReadyAfterSubscribing(t *testing.T) {
	slow := &slowSubscribe{delay: 500 * time.Millisecond}
	broker := mochi.New(&mochi.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := broker.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := broker.AddHook(slow, nil); err != nil {
		t.Fatal(err)
	}
	ln := listeners.NewTCP(listeners.Config{ID: "tcp", Address: "127.0.0.1:0"})
	if err := broker.AddListener(ln); err != nil {
		t.Fatal(err)
	}
	if err := broker.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Close() })

	startExternalGateway(t, ln.Address(), time.Minute)
	if n := slow.subscribed.Load(); n != 1 {
		t.Fatalf("the gateway was ready with %d uplink subscriptions in place, want 1", n)
	}
}
