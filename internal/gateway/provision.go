package gateway

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/metrics"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/transport/mqttext"
	"github.com/mcpgate/mcpgate/internal/vision"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Provisioning configures what devices get besides a session: the OTA
// endpoint, device credentials and the camera endpoint. Zero values get the
// documented defaults.
type Provisioning struct {
	// DeviceAuth is open (default: any device may connect) or token.
	DeviceAuth devauth.Mode
	// DeviceSecret signs device and vision tokens. Main reads it from
	// --device-secret-file; nil uses a random secret for this process only,
	// so tokens issued by `mcpgate devices token` would not verify.
	DeviceSecret []byte
	// SecretInStore signs with the secret kept in the store. In cluster
	// mode the first node to start puts it there (DeviceSecret when set,
	// else a random one), so every node verifies the tokens any node
	// issued; without it each node signs with its own DeviceSecret, which
	// must then be the same on every node (cluster.ErrSecretMismatch). A
	// gateway alone uses the store's when it holds one (a former cluster's,
	// whose devices' tokens then still verify) and never writes it there.
	SecretInStore bool
	// NewSecretFile is the path of DeviceSecret's file when main created
	// it at this start, "" when it was read. Run then refuses
	// (ErrSecretLost) a store showing that device tokens were issued (a
	// device's token in use, a revocation) and holding no secret of its
	// own: they were signed with another secret.
	NewSecretFile string
	// DeviceTokenTTL is the lifetime of device tokens the OTA endpoint
	// issues. Default 720h (30 days), counted from the token's last use
	// (devauth, "Expiry"): a device fetches a new one only at boot.
	DeviceTokenTTL time.Duration
	// OTA configures POST /xiaozhi/ota/; its PublicURL also builds the
	// vision URL. Logger and IssueToken are set by the gateway.
	OTA ota.Config
	// VisionMaxBytes is the largest photo. Default 5 MB.
	VisionMaxBytes int64
	// VisionTokenTTL is the lifetime of the vision token a session gets in
	// initialize; the session sends a fresh one at three quarters of it.
	// Default 1h.
	VisionTokenTTL time.Duration
	// VisionDir is where photos are stored. Default DataDir/photos; a
	// cluster's nodes may share one on a shared volume, so that each lists
	// and serves every node's photos.
	VisionDir string
	// VisionModel, when set, explains photos.
	VisionModel *vision.Model
	// VisionRetention deletes photos older than this. Default 7 days;
	// negative keeps them forever.
	VisionRetention time.Duration
	// VisionMaxPerDevice is the most photos kept per device, the oldest
	// deleted first. Default 100; negative: no limit.
	VisionMaxPerDevice int
	// VisionMaxBytesPerDevice bounds the bytes of photos kept per device,
	// the oldest deleted first. Default 100 MiB; negative: no limit.
	VisionMaxBytesPerDevice int64
	// VisionMaxTotalBytes bounds the bytes of photos kept for all devices
	// together, the oldest of any device deleted first. Default 1 GiB;
	// negative: no limit.
	VisionMaxTotalBytes int64
	// VisionUploadRate (uploads/s) and VisionUploadBurst bound uploads per
	// device. Defaults 0.2/s (one every 5 s) and 5; negative rate: no limit.
	VisionUploadRate  float64
	VisionUploadBurst int
}

// deviceServices are the device-facing services besides the transports.
type deviceServices struct {
	// secretUnwanted is set when the device secret made at this start is
	// not the one the store's tokens were signed with (open mode, which
	// starts anyway): see Gateway.NewSecretUnwanted.
	secretUnwanted atomic.Bool
	hub            *hub.Hub
	store          store.Store // where revocations are kept
	log            *slog.Logger
	cfg            Provisioning
	auth           *devauth.Checker
	ota            *ota.Handler
	vision         *vision.Service
	// mqttPort is the embedded broker's port once it listens, for the OTA
	// answer's default MQTT endpoint; set by New before anything is served.
	mqttPort func() string
	// revoked, when set, tells the other cluster nodes of a revocation
	// (cluster_admin.go).
	revoked atomic.Pointer[func(store.Revocation)]
}

// newDeviceServices makes the device services; tokens, when not nil, is
// the hub's device store, which then keeps each device's token in use.
func newDeviceServices(cfg Config, m *metrics.Metrics, lim *limits.Reporter, h *hub.Hub, tokens *tokenStore) (*deviceServices, error) {
	p := cfg.Provisioning
	mode, err := devauth.ParseMode(string(p.DeviceAuth))
	if err != nil {
		return nil, err
	}
	if p.DeviceTokenTTL == 0 {
		p.DeviceTokenTTL = 720 * time.Hour
	}
	if p.VisionTokenTTL == 0 {
		p.VisionTokenTTL = time.Hour
	}
	if p.DeviceTokenTTL < 0 || p.VisionTokenTTL < 0 {
		return nil, fmt.Errorf("token lifetimes must be positive")
	}
	secret := p.DeviceSecret
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
	}
	authority, err := devauth.New(devauth.Config{Secret: secret,
		LastConnected:    func(id string) time.Time { return lastConnected(h, id) },
		StoredTokenInUse: func(id string) string { return storedTokenInUse(h, tokens, id) }})
	if err != nil {
		return nil, err
	}
	if tokens != nil {
		tokens.auth = authority
	}
	d := &deviceServices{hub: h, store: cfg.Store, log: cfg.Logger, cfg: p, auth: devauth.NewChecker(authority, mode, cfg.Logger, m.Registry)}

	oc := p.OTA
	oc.Logger, oc.Limits = cfg.Logger, lim
	oc.MQTTPort = func() string {
		if d.mqttPort == nil {
			return ""
		}
		return d.mqttPort()
	}
	oc.Upstream = cfg.UpstreamOTA
	if cfg.MQTTUplinkTopic != "" {
		oc.MQTTPublishTopic = cfg.MQTTUplinkTopic // where the broker listens for devices
	}
	if cfg.MQTTBroker != "" {
		// Devices connect to that broker, each on a topic of its own.
		oc.MQTTTopicPerDevice = true
		if addr, err := mqttext.BrokerAddr(cfg.MQTTBroker); err == nil && oc.MQTTEndpoint == "" {
			host, port, _ := net.SplitHostPort(addr)
			if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
				// The gateway's loopback is not the devices': the public
				// host, with the broker's port.
				d.mqttPort = func() string { return port }
			} else {
				oc.MQTTEndpoint = addr
			}
		}
	}
	oc.CheckDeviceID = h.CheckNewID
	oc.IssueToken = func(deviceID, clientID string) (string, error) {
		if err := boundElsewhere(h, mode, deviceID, clientID); err != nil {
			return "", err
		}
		return authority.IssueDevice(deviceID, clientID, p.DeviceTokenTTL)
	}
	if d.ota, err = ota.New(oc); err != nil {
		return nil, err
	}
	d.vision, err = vision.New(vision.Config{
		Dir: cmp.Or(p.VisionDir, filepath.Join(cfg.DataDir, "photos")), MaxBytes: p.VisionMaxBytes, Model: p.VisionModel,
		Verify: d.auth.Vision, Logger: cfg.Logger, Limits: lim, Registerer: m.Registry,
		Retention: p.VisionRetention, MaxPerDevice: p.VisionMaxPerDevice,
		MaxDeviceBytes: p.VisionMaxBytesPerDevice, MaxTotalBytes: p.VisionMaxTotalBytes,
		UploadRate: limits.Rate{PerSecond: p.VisionUploadRate, Burst: p.VisionUploadBurst},
		Resolve: func(ref string) (string, error) {
			dev, err := h.Device(ref)
			if err != nil {
				return "", err
			}
			return dev.ID, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// register mounts the device-facing endpoints (outside the REST guard:
// devices are not browsers) and the photo REST routes (inside it).
func (d *deviceServices) register(mux *http.ServeMux, guard func(http.Handler) http.Handler) {
	mux.Handle(ota.Path, d.ota)
	mux.Handle(ota.PathNoSlash, d.ota)
	mux.Handle(vision.Path, d.vision)
	d.vision.Register(mux, guard)
	mux.Handle("POST /api/v1/devices/{id}/revoke", guard(http.HandlerFunc(d.revoke)))
}

// errRevoked is why a device's connection closes when its tokens are revoked.
var errRevoked = errors.New("device credentials revoked")

// RevokeResult is the answer of POST /api/v1/devices/{id}/revoke.
type RevokeResult struct {
	Device       string    `json:"device"`
	RevokedUntil time.Time `json:"revoked_until"`
	Disconnected bool      `json:"disconnected"`
	// NotDisconnected says why a connection the device may have could not
	// be closed (its node cannot be reached): the revocation holds anyway.
	NotDisconnected string `json:"not_disconnected,omitempty"`
}

// revoke invalidates every token issued to a device until now (device and
// vision tokens alike) and closes its live connection, so a device whose
// credentials leaked is cut off at once; it must be provisioned again (OTA
// or `mcpgate devices token`). The revocation is written to the store
// before the answer, and restored at start (restoreRevocations).
func (d *deviceServices) revoke(w http.ResponseWriter, r *http.Request) {
	// Audited like a forget (hub.AuditAction), success or not, before the
	// answer: a read of the audit log after it lists the revocation.
	act := hub.Action{Tool: hub.AuditRevoke, Caller: auth.FromContext(r.Context()).Caller(), Door: "rest",
		Device: r.PathValue("id"), Start: time.Now()}
	fail := func(status int, code string, err error, msg string) {
		act.Err, act.Outcome = err, code
		d.hub.AuditAction(act)
		writeAPIError(w, status, code, msg)
	}
	// In a cluster, a device another node saw and this one did not is
	// learnt from the shared store. A device that never connected, or was
	// forgotten, may still hold a token (`mcpgate devices token`): an id
	// is revoked all the same (an alias names no one then).
	dev, err := d.hub.DeviceContext(r.Context(), act.Device)
	if err != nil {
		id, nerr := xiaozhi.NormalizeDeviceID(act.Device)
		if nerr != nil {
			fail(http.StatusNotFound, "device_not_found", err, err.Error())
			return
		}
		dev = hub.Device{ID: id}
	}
	act.Device = dev.ID
	now := time.Now().UTC()
	rev, err := d.auth.Authority().RevokeDevice(dev.ID)
	if err != nil {
		fail(http.StatusBadRequest, "bad_request", err, err.Error())
		return
	}
	if tell := d.revoked.Load(); tell != nil {
		(*tell)(store.Revocation(rev))
	}
	// In force in memory already: the live connection is closed whatever
	// the store does next. One that cannot be closed now (held by a node
	// this one cannot reach) is said, not a failure.
	res := RevokeResult{Device: dev.ID, RevokedUntil: now}
	_, res.Disconnected, err = d.hub.Disconnect(dev.ID, errRevoked)
	if err != nil && !errors.Is(err, hub.ErrDeviceNotFound) {
		res.NotDisconnected = err.Error()
	}
	// A revocation the store did not take would be forgotten by a
	// restart, which the operator must know.
	sctx, cancel := store.WriteContext(r.Context())
	defer cancel()
	if err := d.store.AddRevocation(sctx, store.Revocation(rev)); err != nil {
		d.log.Error("device revocation not saved: it holds until the gateway restarts", "device_id", dev.ID,
			"disconnected", res.Disconnected, "error", err)
		fail(http.StatusInternalServerError, "revocation_not_saved", err,
			fmt.Sprintf("the device's credentials are revoked until the gateway restarts (its connection closed: %t), but the store did not keep the revocation: %v",
				res.Disconnected, err))
		return
	}
	if res.NotDisconnected != "" {
		d.log.Warn("device credentials revoked, but its connection could not be closed", "device_id", dev.ID, "error", res.NotDisconnected)
	} else {
		d.log.Info("device credentials revoked", "device_id", dev.ID, "disconnected", res.Disconnected)
	}
	d.hub.AuditAction(act)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

func writeAPIError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// visionFor gives a session its capabilities.vision: the upload URL on the
// public address (or the address the device dialed) and a fresh token. The
// session renews it before it expires.
func (d *deviceServices) visionFor(deviceID, base string) *mcpclient.Vision {
	if d.cfg.OTA.PublicURL != "" {
		base = d.cfg.OTA.PublicURL
	}
	// Taken before issuing: the token expires no earlier.
	expires := time.Now().Add(d.cfg.VisionTokenTTL)
	tok, err := d.auth.Authority().IssueVision(deviceID, d.cfg.VisionTokenTTL)
	if err != nil {
		return nil // an id the transport accepted always normalises; no vision rather than no session
	}
	return &mcpclient.Vision{URL: strings.TrimSuffix(base, "/") + vision.Path, Token: tok, Expires: expires}
}

// SecretSetting is the store's setting holding the cluster's device secret
// (Provisioning.SecretInStore), hex encoded.
const SecretSetting = "device_secret"

// shareSecret makes the store's device secret this gateway's, a cluster
// node putting its own there first if there is none
// (Provisioning.SecretInStore).
func (d *deviceServices) shareSecret(ctx context.Context, node bool) error {
	var v string
	var err error
	if node {
		own := d.cfg.DeviceSecret
		if len(own) == 0 {
			own = make([]byte, 32)
			_, _ = rand.Read(own)
		}
		v, err = d.store.InitSetting(ctx, SecretSetting, hex.EncodeToString(own))
	} else if v, err = d.store.Setting(ctx, SecretSetting); errors.Is(err, store.ErrNotFound) {
		return nil // the secret file's
	}
	what := "the device secret"
	if node {
		what = "the cluster's device secret"
	}
	if err != nil {
		return fmt.Errorf("%s (in the store): %w", what, err)
	}
	secret, err := hex.DecodeString(v)
	if err == nil {
		err = d.auth.Authority().SetSecret(secret)
	}
	if err != nil {
		return fmt.Errorf("%s (setting %s in the store) is damaged: %w", what, SecretSetting, err)
	}
	if len(d.cfg.DeviceSecret) > 0 && !bytes.Equal(secret, d.cfg.DeviceSecret) {
		d.log.Info("signing device tokens with the cluster's secret from the store, not this gateway's own secret file")
	}
	return nil
}

// ErrSecretLost is Run's error when the device secret was created at this
// start (Provisioning.NewSecretFile) for a store whose devices were given
// tokens: a store restored from a backup without its secret file.
var ErrSecretLost = errors.New("the device secret is new, but the store's device tokens were signed with another")

// checkNewSecret refuses a device secret created at this start for a store
// that shows tokens were issued before: every device would be refused
// ("token signature does not match"), in silence until they reconnect.
// Refused rather than warned (in token mode): restoring the file keeps
// every token, while starting on the new secret loses them all for good,
// and a warning scrolls by unread while every device is refused.
func (d *deviceServices) checkNewSecret(ctx context.Context) error {
	if d.cfg.NewSecretFile == "" {
		return nil
	}
	if d.cfg.SecretInStore {
		_, err := d.store.Setting(ctx, SecretSetting)
		if err == nil {
			return nil // the store's own secret signs, not the new file
		}
		if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("the device secret (in the store): %w", err)
		}
	}
	devs, err := d.store.Devices(ctx)
	if err != nil {
		return fmt.Errorf("load devices: %w", err)
	}
	inUse := 0
	for _, dev := range devs {
		if dev.TokenID != "" {
			inUse++
		}
	}
	revs, err := d.store.Revocations(ctx, time.Now())
	if err != nil {
		return fmt.Errorf("load device revocations: %w", err)
	}
	if inUse == 0 && len(revs) == 0 {
		return nil
	}
	if d.auth.Mode() == devauth.ModeOpen {
		// No device is refused yet: said, not refused.
		d.log.Error("the device secret was created at this start, but the store holds device tokens signed with another: "+
			"they will be refused if --device-auth becomes token; restore the device-secret file of the store's backup (docs/store.md#backups). "+
			"The new file is removed at stop, so that a start in token mode refuses the store as this one would",
			"file", d.cfg.NewSecretFile, "tokens_in_use", inUse, "revocations", len(revs))
		d.secretUnwanted.Store(true)
		return nil
	}
	return fmt.Errorf("%w: %s was created at this start, but the store holds %d device(s) with a token in use and %d revocation(s); "+
		"every device token would be refused. Restore the device-secret file of the store's backup to %s (docs/store.md#backups); "+
		"or, to give up every token issued (each device must get a new one), write a new secret yourself: openssl rand -hex 32 > %s",
		ErrSecretLost, d.cfg.NewSecretFile, inUse, len(revs), d.cfg.NewSecretFile, d.cfg.NewSecretFile)
}

// restoreRevocations puts the device-credential revocations of the store
// back in force; Run calls it before devices can connect.
func (d *deviceServices) restoreRevocations(ctx context.Context) (int, error) {
	revs, err := d.store.Revocations(ctx, time.Now())
	if err != nil {
		return 0, fmt.Errorf("load device revocations: %w", err)
	}
	out := make([]devauth.Revocation, len(revs))
	for i, r := range revs {
		out[i] = devauth.Revocation(r)
	}
	d.auth.Authority().Restore(out)
	return len(out), nil
}

// lastConnected returns when the hub last had the device deviceID
// connected: now while it is (here or on another node), the zero time when
// it does not know it. It renews the device's token in use (devauth).
func lastConnected(h *hub.Hub, deviceID string) time.Time {
	dev, err := h.Device(deviceID)
	switch {
	case err != nil || dev.ID != deviceID:
		return time.Time{}
	case dev.Online:
		return time.Now()
	case dev.LastSeen != nil:
		return *dev.LastSeen
	}
	return time.Time{}
}

// storedTokenInUse returns the token in use of device deviceID as the store
// has it, in a cluster, where the device's last connections may have been
// to other nodes; "" alone (the Authority's own is the store's) or when the
// store cannot say.
func storedTokenInUse(h *hub.Hub, tokens *tokenStore, deviceID string) string {
	if tokens == nil || h.NodeID() == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), store.OpTimeout)
	defer cancel()
	d, err := tokens.FindDevice(ctx, deviceID, "")
	if err != nil {
		return ""
	}
	return d.TokenID
}

// tokenStore is the hub's device store. It keeps with each device its
// token in use (store.Device.TokenID, devauth.Authority.TokenInUse) on the
// writes the hub makes anyway (at each connection and disconnection), and
// puts it back when the hub loads the devices at start: a token in use is
// still renewed after a restart.
type tokenStore struct {
	hub.DeviceStore
	auth *devauth.Authority // set by newDeviceServices, before the hub loads or saves a device
}

// newTokenStore returns st as the hub's device store; nil without a store.
func newTokenStore(st store.Store) *tokenStore {
	if st == nil {
		return nil
	}
	return &tokenStore{DeviceStore: st}
}

func (s *tokenStore) SaveDevice(ctx context.Context, d store.Device) error {
	d.TokenID = s.auth.TokenInUse(d.ID)
	return s.DeviceStore.SaveDevice(ctx, d)
}

// SaveDevices saves ds in one write when the store can (store.DeviceBatchSaver).
func (s *tokenStore) SaveDevices(ctx context.Context, ds []store.Device) error {
	bs, ok := s.DeviceStore.(store.DeviceBatchSaver)
	if !ok {
		for _, d := range ds {
			if err := s.SaveDevice(ctx, d); err != nil {
				return err
			}
		}
		return nil
	}
	withTokens := make([]store.Device, len(ds))
	for i, d := range ds {
		d.TokenID = s.auth.TokenInUse(d.ID)
		withTokens[i] = d
	}
	return bs.SaveDevices(ctx, withTokens)
}

func (s *tokenStore) Devices(ctx context.Context) ([]store.Device, error) {
	ds, err := s.DeviceStore.Devices(ctx)
	for _, d := range ds {
		s.auth.RestoreTokenInUse(d.ID, d.TokenID)
	}
	return ds, err
}

// FindDevice is the store's (store.DeviceFinder); ErrNotFound when the
// store cannot find one device.
func (s *tokenStore) FindDevice(ctx context.Context, id, alias string) (store.Device, error) {
	f, ok := s.DeviceStore.(store.DeviceFinder)
	if !ok {
		return store.Device{}, fmt.Errorf("store: device %q: %w", id, store.ErrNotFound)
	}
	return f.FindDevice(ctx, id, alias)
}

// boundElsewhere refuses, when devices need tokens, a token for a device
// the gateway knows under another client id: without it anyone who knew a
// device's MAC got a token from the OTA endpoint and took the device's
// place (the firmware has no secret of its own). The first client id a
// device connects with is trusted; a device that was reset (a new client
// id) is provisioned again once forgotten.
func boundElsewhere(h *hub.Hub, mode devauth.Mode, deviceID, clientID string) error {
	if mode != devauth.ModeToken {
		return nil
	}
	dev, err := h.Device(deviceID)
	if err != nil || dev.ID != deviceID || dev.ClientID == "" || strings.EqualFold(dev.ClientID, clientID) {
		return nil
	}
	return fmt.Errorf("%w: device %s is bound to another client id than %q: if it was reset, forget it "+
		"(mcpgate devices forget %s) so that it can be provisioned again", ota.ErrForbidden, deviceID, clientID, deviceID)
}

// warnMQTTPortTLS warns when the OTA endpoint tells devices a broker port
// they would dial with the wrong protocol: firmware (EspMqtt::Connect)
// speaks TLS to port 8883 and plain TCP to any other, whatever the broker
// speaks. Only for the endpoint derived from the broker: one given with
// --ota-mqtt-endpoint may reach it through a proxy.
func (g *Gateway) warnMQTTPortTLS() {
	oc := g.devices.cfg.OTA
	if g.cfg.UpstreamOTA != "" || oc.MQTTEndpoint != "" || !tellsMQTT(oc) {
		return
	}
	var port, flag string
	var tls bool
	switch {
	case g.mqtt != nil:
		_, port, _ = net.SplitHostPort(g.mqtt.Addr())
		tls, flag = g.cfg.MQTTTLS != nil, "--mqtt-addr"
	case g.cfg.MQTTBroker != "":
		addr, err := mqttext.BrokerAddr(g.cfg.MQTTBroker)
		if err != nil {
			return
		}
		_, port, _ = net.SplitHostPort(addr)
		u, _ := url.Parse(g.cfg.MQTTBroker) // BrokerAddr parsed it
		tls, flag = u.Scheme == "ssl" || u.Scheme == "tls" || u.Scheme == "mqtts", "--mqtt-broker"
	default:
		return
	}
	if msg := mqttPortTLSMismatch(port, tls); msg != "" {
		g.log.Warn(msg+"; devices could never connect: use port 8883 for TLS and another for plain TCP ("+flag+"), or set --ota-mqtt-endpoint",
			"mqtt_port", port, "tls", tls)
	}
}

// tellsMQTT reports whether the OTA endpoint tells any device to use MQTT.
func tellsMQTT(oc ota.Config) bool {
	if strings.EqualFold(string(oc.Transport), string(ota.TransportMQTT)) {
		return true
	}
	for _, t := range oc.TransportFor {
		if strings.EqualFold(string(t), string(ota.TransportMQTT)) {
			return true
		}
	}
	return false
}

// mqttPortTLSMismatch says how firmware would dial a broker on port that
// speaks TLS or not, when that is the wrong protocol; "" when it is right.
func mqttPortTLSMismatch(port string, tls bool) string {
	switch {
	case tls && port != "8883":
		return "MQTT devices told port " + port + " by the OTA endpoint would dial the broker's TLS listener in plain TCP: firmware speaks TLS only to port 8883"
	case !tls && port == "8883":
		return "MQTT devices told port 8883 by the OTA endpoint would dial the broker in TLS, which it does not speak: firmware speaks TLS to port 8883"
	}
	return ""
}
