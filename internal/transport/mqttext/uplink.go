package mqttext

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// ProbeLevel is the uplink topic level of the gateway's self-probe: the
// gateway publishes on <UplinkTopic>/ProbeLevel and expects to hear it. Its
// colon keeps it from every device (deviceOf takes no level with a colon),
// and devices read only their downlink topics.
const ProbeLevel = "mcpgate:probe"

// errUnverified marks a subscription the broker accepted but the gateway
// could not probe: it is taken as working.
var errUnverified = errors.New("cannot check that the uplink subscription delivers")

// Ready reports why the device uplink does not work, or nil when it does:
// the broker is not connected, refused the subscription, or delivers
// nothing of it (the probe did not come back).
func (t *Transport) Ready() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.uplinkErr
}

// connectionUp starts checking the uplink of a new broker connection,
// instead of the previous connection's check.
func (t *Transport) connectionUp(cm *autopaho.ConnectionManager) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopCheck != nil {
		t.stopCheck()
	}
	if !t.conns.Add() {
		return
	}
	ctx, cancel := context.WithCancel(t.conns.Context())
	t.stopCheck = cancel
	go func() {
		defer t.conns.Done()
		defer cancel()
		t.checkUntilUp(ctx, cm)
	}()
}

// connectionDown stops the check of the lost connection's uplink, and
// fails the requests in flight to every device: their answers, if any, went
// to a connection that is no more (QoS 0, no broker session). The sessions
// stay; the recheck after the reconnect pings them.
func (t *Transport) connectionDown() {
	t.mu.Lock()
	if t.stopCheck != nil {
		t.stopCheck()
		t.stopCheck = nil
	}
	t.uplinkErr = errNoConnection
	t.downAt = time.Now()
	live := make([]*session, 0, len(t.live))
	for _, s := range t.live {
		live = append(live, s)
	}
	t.mu.Unlock()
	for _, s := range live {
		s.sess.FailPending(errBrokerLost)
	}
	t.log.Warn("lost the connection to the MQTT broker; reconnecting", "broker", t.server.Redacted(), "sessions", len(live))
}

// setUplink records the outcome of a check unless its connection is gone
// (ctx ended, under mu as connectionDown cancels it).
func (t *Transport) setUplink(ctx context.Context, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if ctx.Err() == nil {
		t.uplinkErr = err
	}
}

// checkUntilUp subscribes to the uplink and probes it, again and again
// with a growing pause, until it works or ctx ends: without the uplink the
// node serves nobody. A broker connection has no session kept, so each one
// subscribes anew.
func (t *Transport) checkUntilUp(ctx context.Context, cm *autopaho.ConnectionManager) {
	pause := time.Second
	for {
		err := t.checkUplink(ctx, cm)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			t.log.Info("subscribed to the device uplink", "subscription", t.filter, "probe", t.probeTopic)
		case errors.Is(err, errUnverified):
			t.log.Warn("subscribed to the device uplink, unchecked", "subscription", t.filter, "error", err)
		default:
			t.setUplink(ctx, err)
			t.log.Error("the device uplink does not work; retrying", "subscription", t.filter, "error", err, "retry_in", pause)
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, 30*time.Second)
			continue
		}
		t.setUplink(ctx, nil)
		t.checkDownlink(ctx, cm)
		select {
		case <-t.subscribed:
			// A reconnect: what devices said meanwhile is lost.
			t.recheck(ctx)
		default:
			t.subscribedOnce.Do(func() { close(t.subscribed) })
		}
		return
	}
}

// checkUplink subscribes to the uplink, and non-shared to the probe topic,
// then publishes a probe and waits for it. A broker may accept a
// subscription and then deliver none of it: Mosquitto's acl_file grants
// every SUBSCRIBE and checks reading at each delivery. It returns nil when
// the probe came back, errUnverified when the broker lets the gateway
// neither subscribe to nor publish the probe, and otherwise why the uplink
// does not work.
func (t *Transport) checkUplink(ctx context.Context, cm *autopaho.ConnectionManager) error {
	sctx, cancel := context.WithTimeout(ctx, t.cfg.ProbeTimeout)
	defer cancel()
	sa, err := cm.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{
		{Topic: t.filter, QoS: 0}, {Topic: t.probeTopic, QoS: 0},
	}})
	if sa == nil {
		return fmt.Errorf("subscribe to %s: %w", t.filter, err)
	}
	if len(sa.Reasons) != 2 {
		return fmt.Errorf("subscribe to %s: SUBACK with %d reason codes for 2 subscriptions", t.filter, len(sa.Reasons))
	}
	if code := sa.Reasons[0]; code >= 0x80 {
		return fmt.Errorf("the broker refused the subscription to %s: SUBACK %s (its ACL must let this login subscribe to it)",
			t.filter, reasonText(code, subackReason(sa)))
	}
	if code := sa.Reasons[1]; code >= 0x80 {
		return fmt.Errorf("%w: the broker refused the probe's subscription to %s: SUBACK %s (let this login read it)",
			errUnverified, t.probeTopic, reasonText(code, subackReason(sa)))
	}
	return t.probe(ctx, cm)
}

// probe publishes a nonce on the probe topic and waits for it to come back.
func (t *Transport) probe(ctx context.Context, cm *autopaho.ConnectionManager) error {
	nonce := randomHex(8)
	back := make(chan struct{})
	t.mu.Lock()
	t.probes[nonce] = back
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.probes, nonce)
		t.mu.Unlock()
	}()
	pctx, cancel := context.WithTimeout(ctx, t.cfg.ProbeTimeout)
	defer cancel()
	// QoS 1: an MQTT 5 broker says in PUBACK when its ACL refuses the
	// publish. This runs on a goroutine of its own, never paho's router.
	pr, err := cm.Publish(pctx, &paho.Publish{Topic: t.probeTopic, QoS: 1, Payload: []byte(nonce)})
	if err != nil {
		if pr != nil && pr.ReasonCode >= 0x80 {
			return fmt.Errorf("%w: the broker refused the gateway's probe on %s: PUBACK %s (let this login write it)",
				errUnverified, t.probeTopic, reasonText(pr.ReasonCode, pubackReason(pr)))
		}
		return fmt.Errorf("publish a probe on %s: %w", t.probeTopic, err)
	}
	select {
	case <-back:
		return nil
	case <-pctx.Done():
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("the broker accepted the subscription to %s, but a probe published on %s did not come back within %s: "+
			"its ACL likely lets this login subscribe and not read %s/+ (Mosquitto: \"topic read %[4]s/+\" for the gateway's user)",
			t.filter, t.probeTopic, t.cfg.ProbeTimeout, t.cfg.UplinkTopic)
	}
}

// DownlinkProbeLevel is the downlink topic level of the gateway's downlink
// check: no device has it, as a device's downlink topic writes colons as
// underscores.
const DownlinkProbeLevel = "mcpgate:probe"

// checkDownlink publishes at QoS 1 on the downlink probe topic and logs an
// error when the broker refuses it: the devices' downlink is published at
// QoS 0, which a broker drops unsaid when its ACL refuses it, and devices
// would then be heard and never asked anything.
func (t *Transport) checkDownlink(ctx context.Context, cm *autopaho.ConnectionManager) {
	topic := xiaozhi.P2PTopicPrefix + DownlinkProbeLevel
	pctx, cancel := context.WithTimeout(ctx, t.cfg.ProbeTimeout)
	defer cancel()
	pr, err := cm.Publish(pctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte("{}")})
	switch {
	case err == nil:
	case pr != nil && pr.ReasonCode >= 0x80:
		t.log.Error("the broker refuses the gateway's downlink: devices will get no request", "topic", topic,
			"reason", "PUBACK "+reasonText(pr.ReasonCode, pubackReason(pr)),
			"fix", fmt.Sprintf("let this login write %s+ (Mosquitto: \"topic write %[1]s+\" for the gateway's user)", xiaozhi.P2PTopicPrefix))
	case ctx.Err() == nil:
		t.log.Warn("cannot check the gateway's downlink", "topic", topic, "error", err)
	}
}

// probeBack takes a message on the probe topic: this node's probe coming
// back, or another node's, which is ignored.
func (t *Transport) probeBack(payload []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if back, ok := t.probes[string(payload)]; ok {
		close(back)
		delete(t.probes, string(payload))
	}
}

// reasonText is an MQTT 5 failure reason code with its name, and the
// broker's reason string when it sent one.
func reasonText(code byte, reason string) string {
	s := fmt.Sprintf("%#02x", code)
	if name, ok := reasonNames[code]; ok {
		s += " " + name
	}
	if reason != "" {
		s += ": " + reason
	}
	return s
}

func subackReason(sa *paho.Suback) string {
	if sa.Properties == nil {
		return ""
	}
	return sa.Properties.ReasonString
}

func pubackReason(pr *paho.PublishResponse) string {
	if pr.Properties == nil {
		return ""
	}
	return pr.Properties.ReasonString
}

// reasonNames names the failure codes of CONNACK, SUBACK, PUBACK and
// DISCONNECT (MQTT 5).
var reasonNames = map[byte]string{
	0x80: "unspecified error",
	0x81: "malformed packet",
	0x82: "protocol error",
	0x83: "implementation specific error",
	0x84: "unsupported protocol version",
	0x85: "client identifier not valid",
	0x86: "bad user name or password",
	0x87: "not authorized",
	0x88: "server unavailable",
	0x89: "server busy",
	0x8A: "banned",
	0x8B: "server shutting down",
	0x8C: "bad authentication method",
	0x8D: "keep alive timeout",
	0x8E: "session taken over",
	0x8F: "topic filter invalid",
	0x90: "topic name invalid",
	0x91: "packet identifier in use",
	0x93: "receive maximum exceeded",
	0x95: "packet too large",
	0x97: "quota exceeded",
	0x98: "administrative action",
	0x99: "payload format invalid",
	0x9A: "retain not supported",
	0x9B: "QoS not supported",
	0x9C: "use another server",
	0x9D: "server moved",
	0x9E: "shared subscriptions not supported",
	0x9F: "connection rate exceeded",
	0xA1: "subscription identifiers not supported",
	0xA2: "wildcard subscriptions not supported",
}

// errRefused marks a CONNACK that refuses the gateway for good: its login,
// its client id, or the gateway itself.
var errRefused = errors.New("the MQTT broker refused the gateway's connection")

// connectError names the CONNACK reason of a refused connection attempt,
// and marks the refusals that retrying cannot help with errRefused.
func connectError(err error) error {
	var ce *autopaho.ConnackError
	if !errors.As(err, &ce) {
		return err
	}
	text := "CONNACK " + reasonText(ce.ReasonCode, ce.Reason)
	switch ce.ReasonCode {
	case 0x86, 0x87, 0x8C:
		return fmt.Errorf("%w: %s: check the gateway's login (--mqtt-broker-username and --mqtt-broker-password, "+
			"or tcp://user:password@host in --mqtt-broker) and the broker's password file or ACL", errRefused, text)
	case 0x85, 0x8A:
		return fmt.Errorf("%w: %s", errRefused, text)
	}
	return errors.New(text)
}

// disconnectText is the reason of a DISCONNECT from the broker, with a
// hint for a takeover: another client connected with the gateway's id.
func disconnectText(d *paho.Disconnect) string {
	reason := ""
	if d.Properties != nil {
		reason = d.Properties.ReasonString
	}
	s := reasonText(d.ReasonCode, reason)
	if d.ReasonCode == 0x8E {
		s += " (another client connected with the gateway's client id)"
	}
	return s
}
