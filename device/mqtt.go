package device

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// DefaultKeepalive is the MQTT keepalive firmware uses.
const DefaultKeepalive = 240 * time.Second

// MQTTClientOptions configures an [MQTTClient]. Broker, DeviceID and Server
// are required; every other zero value means the documented default.
type MQTTClientOptions struct {
	// Broker is the broker's host:port, e.g. 127.0.0.1:1883.
	Broker string
	// TLS, when set, dials the broker over TLS.
	TLS *tls.Config
	// DeviceID is the device's MAC address.
	DeviceID string
	// ClientID is the MQTT client id; "" derives
	// GID_mcpgate@@@<mac_with_underscores>@@@<random uuid>.
	ClientID string
	// Username and Password are sent in CONNECT when not empty.
	Username, Password string
	// PublishTopic is where every message goes; "" means "device-server",
	// or "device-server/<mac_with_underscores>" with Subscribe.
	PublishTopic string
	// Subscribe is for a stock external broker (the gateway's
	// --mqtt-broker mode), which delivers downlink only to subscribers: the
	// client then subscribes to its own devices/p2p/<mac> topic, announces
	// itself with {"type":"online"} after each CONNECT, and leaves an MQTT
	// Will {"type":"offline"} on PublishTopic, also sent when Close ends the
	// connection. Firmware does none of this.
	Subscribe bool
	// Keepalive is the MQTT keepalive; 0 means DefaultKeepalive.
	Keepalive time.Duration
	// Server answers the gateway's MCP requests. It keeps its state across
	// reconnects.
	Server *Server
	// ConnectTimeout bounds the dial and the CONNECT exchange; 0 means
	// DefaultHelloTimeout.
	ConnectTimeout time.Duration
	// MinBackoff and MaxBackoff bound the jittered exponential wait between
	// reconnects; 0 means DefaultMinBackoff and DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// Logger receives connection logs; nil discards them.
	Logger *slog.Logger
	// OnState, if set, is called on every connection state change, from the
	// goroutine running Run. It must not block.
	OnState func(State)
}

// MQTTClient connects a device's [Server] to a gateway's MQTT broker, the way
// firmware does: it publishes every message to PublishTopic and never
// subscribes; the gateway delivers downlink messages on the connection
// itself, and the client takes any PUBLISH it receives as one.
//
// An MQTTClient is safe for concurrent use, but Run is meant to be called once.
type MQTTClient struct {
	opts     MQTTClientOptions // defaults filled in
	deviceID string
	log      *slog.Logger
}

// NewMQTTClient validates the options and returns a client. It does not connect.
func NewMQTTClient(opts MQTTClientOptions) (*MQTTClient, error) {
	if _, _, err := net.SplitHostPort(opts.Broker); err != nil {
		return nil, fmt.Errorf("device: broker address %q: %w", opts.Broker, err)
	}
	id, err := xiaozhi.NormalizeDeviceID(opts.DeviceID)
	if err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	if opts.Server == nil {
		return nil, errors.New("device: MQTTClientOptions.Server is required")
	}
	if opts.ClientID == "" {
		opts.ClientID = xiaozhi.MQTTClientID{Group: xiaozhi.DefaultMQTTGroup, DeviceID: id, UUID: newUUID()}.String()
	}
	if opts.PublishTopic == "" {
		opts.PublishTopic = xiaozhi.DefaultUplinkTopic
		if opts.Subscribe {
			opts.PublishTopic = xiaozhi.DeviceUplinkTopic(xiaozhi.DefaultUplinkTopic, id)
		}
	}
	if opts.Keepalive <= 0 {
		opts.Keepalive = DefaultKeepalive
	}
	if opts.Keepalive/time.Second > 65535 {
		return nil, fmt.Errorf("device: keepalive %v over MQTT's 65535 s", opts.Keepalive)
	}
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = DefaultHelloTimeout
	}
	log, err := reconnectDefaults(&opts.MinBackoff, &opts.MaxBackoff, opts.Logger, id)
	if err != nil {
		return nil, err
	}
	return &MQTTClient{opts: opts, deviceID: id, log: log}, nil
}

// DeviceID returns the normalised device id.
func (c *MQTTClient) DeviceID() string { return c.deviceID }

// ClientID returns the MQTT client id the client connects with.
func (c *MQTTClient) ClientID() string { return c.opts.ClientID }

// Run keeps the device connected until ctx ends, like [Client.Run].
func (c *MQTTClient) Run(ctx context.Context) error {
	return keepConnected(ctx, c.opts.MinBackoff, c.opts.MaxBackoff, c.log, c.opts.OnState, c.Connect)
}

// Connect dials the broker and completes CONNECT; MCP may start at once.
// The caller must Serve or Close the session.
func (c *MQTTClient) Connect(ctx context.Context) (*Session, error) {
	cctx, cancel := context.WithTimeout(ctx, c.opts.ConnectTimeout)
	defer cancel()
	var conn net.Conn
	var err error
	if c.opts.TLS != nil {
		conn, err = (&tls.Dialer{Config: c.opts.TLS}).DialContext(cctx, "tcp", c.opts.Broker)
	} else {
		conn, err = (&net.Dialer{}).DialContext(cctx, "tcp", c.opts.Broker)
	}
	if err != nil {
		return nil, fmt.Errorf("device: dial %s: %w", c.opts.Broker, err)
	}
	l := &mqttLink{topic: c.opts.PublishTopic, in: make(chan []byte, 16), closed: make(chan struct{}), will: c.opts.Subscribe,
		disconnect: make(chan byte, 1)}
	l.cli = paho.NewClient(paho.ClientConfig{
		Conn: packets.NewThreadSafeConn(conn),
		// Any PUBLISH is downlink: the client never subscribes.
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){l.onPublish},
		OnServerDisconnect: func(d *paho.Disconnect) {
			select {
			case l.disconnect <- d.ReasonCode:
			default:
			}
		},
	})
	cp := &paho.Connect{
		ClientID: c.opts.ClientID, KeepAlive: uint16(c.opts.Keepalive / time.Second), CleanStart: true,
		Username: c.opts.Username, UsernameFlag: c.opts.Username != "",
		Password: []byte(c.opts.Password), PasswordFlag: c.opts.Password != "",
	}
	if c.opts.Subscribe {
		cp.WillMessage = &paho.WillMessage{Topic: c.opts.PublishTopic, Payload: []byte(presenceOffline)}
	}
	if ca, err := l.cli.Connect(cctx, cp); err != nil {
		_ = conn.Close()
		if ca != nil && refusesCredentials(ca.ReasonCode) {
			return nil, fmt.Errorf("%w: MQTT broker %s: %w (CONNACK reason 0x%02x)", ErrUnauthorized, c.opts.Broker, err, ca.ReasonCode)
		}
		return nil, fmt.Errorf("device: MQTT connect to %s: %w", c.opts.Broker, err)
	}
	if c.opts.Subscribe {
		if err := c.announce(cctx, l); err != nil {
			_ = l.Close()
			return nil, err
		}
	}
	l.touch()
	// No idle timeout: MQTT keepalive (PINGREQ) detects a dead broker.
	return newSession(l, c.opts.Server, "", 0, c.log), nil
}

// refusesCredentials reports whether a CONNACK reason code (MQTT 5, which
// this client speaks) refuses the client's credentials: bad user name or
// password, not authorized, bad authentication method.
func refusesCredentials(code byte) bool {
	return code == 0x86 || code == 0x87 || code == 0x8C
}

const (
	presenceOnline  = `{"type":"` + xiaozhi.TypeOnline + `"}`
	presenceOffline = `{"type":"` + xiaozhi.TypeOffline + `"}`
)

// announce subscribes to the device's downlink topic, then tells the
// gateway the device is (back) online, in that order so that the gateway's
// first request cannot be published before the subscription exists.
func (c *MQTTClient) announce(ctx context.Context, l *mqttLink) error {
	topic := xiaozhi.P2PTopic(c.deviceID)
	if _, err := l.cli.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 0}}}); err != nil {
		return fmt.Errorf("device: subscribe to %s: %w", topic, err)
	}
	if err := l.Write(ctx, []byte(presenceOnline)); err != nil {
		return fmt.Errorf("device: announce on %s: %w", l.topic, err)
	}
	return nil
}

// mqttLink is a link over one MQTT connection.
type mqttLink struct {
	cli      *paho.Client
	topic    string
	in       chan []byte // downlink payloads, fed by paho's router goroutine
	closed   chan struct{}
	once     sync.Once
	received atomic.Int64 // unix nanos of the last message
	will     bool         // a Will is set: Close asks the broker to send it
	// disconnect takes the reason code of the broker's DISCONNECT.
	disconnect chan byte
}

var errMQTTLost = errors.New("MQTT connection lost")

// errTakenOver: the broker ended the connection for a newer one with the
// same client id (DISCONNECT reason 0x8E, "session taken over").
var errTakenOver = fmt.Errorf("%w: the broker gave this client id's session to a newer connection (DISCONNECT 0x8E), replaced", errMQTTLost)

// disconnectWait is how long a lost connection's Read waits for the
// broker's DISCONNECT reason: paho closes the connection first and tells
// the reason after, on a goroutine of its own.
const disconnectWait = 200 * time.Millisecond

// lost is why the connection ended: taken over, or lost.
func (l *mqttLink) lost() error {
	select {
	case code := <-l.disconnect:
		if code == 0x8E {
			return errTakenOver
		}
		return fmt.Errorf("%w: the broker disconnected (reason 0x%02x)", errMQTTLost, code)
	case <-time.After(disconnectWait):
		return errMQTTLost
	}
}

func (l *mqttLink) touch() { l.received.Store(time.Now().UnixNano()) }

func (l *mqttLink) LastReceived() time.Time { return time.Unix(0, l.received.Load()) }

// onPublish hands one downlink message to Read, waiting while the session is
// busy (backpressure on the connection) but never after the link closed.
func (l *mqttLink) onPublish(pr paho.PublishReceived) (bool, error) {
	l.touch()
	select {
	case l.in <- pr.Packet.Payload:
	case <-l.closed:
	case <-l.cli.Done():
	}
	return true, nil
}

func (l *mqttLink) Read(ctx context.Context) ([]byte, error) {
	select {
	case msg := <-l.in:
		return msg, nil
	case <-l.closed:
		return nil, net.ErrClosed
	case <-l.cli.Done():
		return nil, l.lost()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *mqttLink) Write(ctx context.Context, msg []byte) error {
	_, err := l.cli.Publish(ctx, &paho.Publish{Topic: l.topic, QoS: 0, Payload: msg})
	return err
}

// Close sends DISCONNECT and closes the connection; paho waits for its goroutines.
func (l *mqttLink) Close() error {
	var err error
	l.once.Do(func() {
		close(l.closed)
		// 0x04 "disconnect with Will message": the gateway learns at once
		// that the device left, as after an abrupt disconnect.
		var code byte
		if l.will {
			code = 0x04
		}
		err = l.cli.Disconnect(&paho.Disconnect{ReasonCode: code})
	})
	return err
}
