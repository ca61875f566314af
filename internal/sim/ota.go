package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// OTAReply is the part of an OTA reply a simulated device uses, stored as
// firmware stores it.
type OTAReply struct {
	WebSocket *struct {
		URL     string `json:"url"`
		Token   string `json:"token"`
		Version int    `json:"version"`
	} `json:"websocket"`
	MQTT     *OTAMQTT `json:"mqtt"`
	Firmware *struct {
		Version string `json:"version"`
		URL     string `json:"url"`
	} `json:"firmware"`
}

// OTAMQTT is the mqtt section of an OTA reply.
type OTAMQTT struct {
	Endpoint     string `json:"endpoint"`
	ClientID     string `json:"client_id"`
	Username     string `json:"username"`
	Password     string `json:"password"`
	PublishTopic string `json:"publish_topic"`
	Keepalive    int    `json:"keepalive"` // seconds
}

// Provision posts the device's system information to otaURL, as firmware
// does at boot, and keeps what the reply says to connect with: its mqtt
// section when there is one (firmware prefers it), else its WebSocket URL
// and token.
func (d *Device) Provision(ctx context.Context, otaURL string) (*OTAReply, error) {
	info, err := d.systemInfo()
	if err != nil {
		return nil, fmt.Errorf("sim: system info: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, otaURL, strings.NewReader(info))
	if err != nil {
		return nil, fmt.Errorf("sim: OTA request: %w", err)
	}
	name, version := serverInfo(d.cfg.Profile)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(xiaozhi.HeaderDeviceID, d.MAC)
	req.Header.Set(xiaozhi.HeaderClientID, d.ClientID)
	req.Header.Set("Activation-Version", "1")
	req.Header.Set("User-Agent", name+"/"+version)
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sim: OTA: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("sim: OTA: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sim: OTA answered %s: %s", resp.Status, bytes.TrimSpace(body))
	}
	var r OTAReply
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("sim: OTA reply: %w", err)
	}
	// Firmware prefers an mqtt section over a websocket one.
	if r.MQTT != nil {
		if r.MQTT.Endpoint == "" || r.MQTT.ClientID == "" {
			return &r, errors.New("sim: OTA reply has an mqtt section without endpoint or client_id")
		}
		if r.MQTT.Keepalive < 0 {
			return &r, fmt.Errorf("sim: OTA reply has a negative mqtt keepalive %d", r.MQTT.Keepalive)
		}
		m := *r.MQTT
		d.mqtt = &m
		return &r, nil
	}
	if r.WebSocket == nil || r.WebSocket.URL == "" {
		return &r, errors.New("sim: OTA reply has no websocket url")
	}
	d.url, d.token = r.WebSocket.URL, r.WebSocket.Token
	return &r, nil
}
