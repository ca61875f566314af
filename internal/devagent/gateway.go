package devagent

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/bridge"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// GatewayOptions says how to reach a gateway as a XiaoZhi device: Server
// (a WebSocket URL) or OTA (an OTA URL whose answer names the WebSocket or
// MQTT settings and the token), exactly one.
type GatewayOptions struct {
	Server string
	OTA    string
	// Token is the device token for Server; an OTA answer brings its own.
	Token string
	// MinBackoff and MaxBackoff bound the reconnect waits; 0 means the
	// device SDK's defaults.
	MinBackoff, MaxBackoff time.Duration
	// OnState, if set, sees every connection state change.
	OnState func(device.State)
}

// RunGateway connects the agent to a gateway and keeps it connected until
// ctx ends, reconnecting with jittered backoff. With OTA it first
// provisions, retrying until the OTA endpoint answers, as firmware does at
// boot, and provisions again whenever the gateway refuses the credentials
// it was given (a device token expired or revoked). It returns ctx's
// error, or a configuration error at once.
func (a *Agent) RunGateway(ctx context.Context, o GatewayOptions) error {
	if (o.Server == "") == (o.OTA == "") {
		return errors.New("devagent: give either a server URL (--server) or an OTA URL (--ota)")
	}
	if o.OTA == "" {
		c, err := device.NewClient(device.ClientOptions{URL: o.Server, DeviceID: a.id, ClientID: a.clientID, Token: o.Token,
			Server: a.srv, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Logger: a.log, OnState: o.OnState})
		if err != nil {
			return err
		}
		return c.Run(ctx)
	}
	bo := bridge.Backoff{Min: o.MinBackoff, Max: o.MaxBackoff}
	if bo.Min <= 0 {
		bo.Min = device.DefaultMinBackoff
	}
	if bo.Max <= 0 {
		bo.Max = device.DefaultMaxBackoff
	}
	for {
		reply, err := a.Provision(ctx, o.OTA)
		if err == nil {
			bo.Reset()
			err = a.runProvisioned(ctx, reply, o)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !errors.Is(err, device.ErrUnauthorized) {
				return err // a configuration error in the answer
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		wait := bo.Next()
		if errors.Is(err, device.ErrUnauthorized) {
			a.log.Warn("the gateway refused the provisioned credentials; provisioning again", "error", err, "retry_in", wait.Round(time.Millisecond))
		} else {
			a.log.Warn("OTA provisioning failed; retrying", "error", err, "retry_in", wait.Round(time.Millisecond))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// runProvisioned runs the client the OTA answer asks for until ctx ends or
// the gateway refuses its credentials (an expired or revoked token): then it
// returns an error wrapping device.ErrUnauthorized, so the caller provisions
// again for fresh ones, as a rebooted device would.
func (a *Agent) runProvisioned(ctx context.Context, reply *OTAReply, o GatewayOptions) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	onState := o.OnState
	o.OnState = func(s device.State) {
		if onState != nil {
			onState(s)
		}
		if s.Status == device.StatusDisconnected && errors.Is(s.Err, device.ErrUnauthorized) {
			cancel(s.Err)
		}
	}
	run, err := a.clientFor(reply, o)
	if err != nil {
		return err
	}
	a.log.Info("provisioned", "transport", reply.transport())
	_ = run(ctx)
	return context.Cause(ctx)
}

// OTAReply is the part of an OTA answer the agent uses.
type OTAReply struct {
	WebSocket *struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	} `json:"websocket"`
	MQTT *struct {
		Endpoint     string `json:"endpoint"`
		ClientID     string `json:"client_id"`
		Username     string `json:"username"`
		Password     string `json:"password"`
		PublishTopic string `json:"publish_topic"`
		Keepalive    int    `json:"keepalive"`
	} `json:"mqtt"`
}

func (r *OTAReply) transport() string {
	if r.MQTT != nil {
		return "mqtt"
	}
	return "websocket"
}

// Provision posts the device's system information to the OTA URL, as
// firmware does at boot, and returns the answer. Like firmware it prefers
// an mqtt section to a websocket one.
func (a *Agent) Provision(ctx context.Context, otaURL string) (*OTAReply, error) {
	var info struct {
		MACAddress  string `json:"mac_address"`
		UUID        string `json:"uuid"`
		Application struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"application"`
		Board struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"board"`
	}
	info.MACAddress, info.UUID = a.id, a.clientID
	info.Application.Name, info.Application.Version = a.cfg.Name, a.cfg.Version
	info.Board.Type, info.Board.Name = "mcpgate-device", "linux"
	body, _ := json.Marshal(info) // plain strings always marshal
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, otaURL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("OTA URL: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(xiaozhi.HeaderDeviceID, a.id)
	req.Header.Set(xiaozhi.HeaderClientID, a.clientID)
	req.Header.Set("Activation-Version", "1")
	req.Header.Set("User-Agent", "mcpgate-device/"+a.cfg.Version)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("OTA: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("OTA: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("OTA answered %s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var r OTAReply
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("OTA answer is not JSON: %w", err)
	}
	switch {
	case r.MQTT != nil:
		if r.MQTT.Endpoint == "" {
			return nil, errors.New("OTA answer has an mqtt section without an endpoint")
		}
	case r.WebSocket == nil || r.WebSocket.URL == "":
		return nil, errors.New("OTA answer names neither a websocket url nor an mqtt endpoint")
	}
	return &r, nil
}

// clientFor returns the run loop of the client the OTA answer asks for.
func (a *Agent) clientFor(r *OTAReply, o GatewayOptions) (func(context.Context) error, error) {
	if m := r.MQTT; m != nil {
		broker := m.Endpoint
		if _, _, err := net.SplitHostPort(broker); err != nil {
			broker = net.JoinHostPort(strings.TrimSuffix(broker, "/"), "1883")
		}
		var tlsConf *tls.Config
		if host, port, _ := net.SplitHostPort(broker); port == "8883" { // MQTT over TLS, as firmware assumes
			tlsConf = &tls.Config{ServerName: host}
		}
		c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: broker, TLS: tlsConf, DeviceID: a.id, ClientID: m.ClientID,
			Username: m.Username, Password: m.Password, PublishTopic: m.PublishTopic, Keepalive: time.Duration(m.Keepalive) * time.Second,
			Server: a.srv, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Logger: a.log, OnState: o.OnState})
		if err != nil {
			return nil, err
		}
		return c.Run, nil
	}
	c, err := device.NewClient(device.ClientOptions{URL: r.WebSocket.URL, DeviceID: a.id, ClientID: a.clientID,
		Token: r.WebSocket.Token, Server: a.srv, MinBackoff: o.MinBackoff, MaxBackoff: o.MaxBackoff, Logger: a.log, OnState: o.OnState})
	if err != nil {
		return nil, err
	}
	return c.Run, nil
}
