package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/ota"
)

// selfSigned returns a server certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mcpgate test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// With a certificate configured, the embedded broker's listener speaks TLS:
// a TLS device is discovered and called; a plain-TCP device gets nowhere.
func TestMQTTOverTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	gw := startGateway(t, Config{MQTTAddr: "127.0.0.1:0",
		MQTTTLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	var mu sync.Mutex
	level := 0
	mac := "02:00:00:13:00:01"
	c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: mac,
		Server: newServer(t, device.ProfileESP32, volumeTool(&level, &mu)), Username: "u", Password: "p",
		TLS: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer runInBackground(t, c.Run)()
	waitState(t, gw, mac, hub.StateReady)
	if text, isErr, err := call(t, gw, mac, "self.audio_speaker.set_volume", `{"volume":12}`, 5*time.Second); err != nil || isErr || text != "true" {
		t.Fatalf("call over TLS = %q %v %v", text, isErr, err)
	}

	plain, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: "02:00:00:13:00:02",
		Server: newServer(t, device.ProfileESP32), ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer pcancel()
	if s, err := plain.Connect(pctx); err == nil {
		_ = s.Close()
		t.Fatal("a plain-TCP client connected to the TLS listener")
	}
	if _, err := gw.Hub().Device("02:00:00:13:00:02"); err == nil {
		t.Fatal("the plain-TCP device reached the hub")
	}
}

// TestMQTTPortTLSWarning: firmware speaks TLS to port 8883 and plain TCP to
// any other (EspMqtt::Connect), so a gateway whose OTA endpoint tells
// devices a TLS broker on another port warns at start. It does not when no
// device is told MQTT, or when the endpoint is given explicitly.
func TestMQTTPortTLSWarning(t *testing.T) {
	cert, _ := selfSigned(t)
	const warning = "firmware speaks TLS only to port 8883"
	for _, tc := range []struct {
		name string
		ota  ota.Config
		warn bool
	}{
		{"ota mqtt", ota.Config{Transport: ota.TransportMQTT}, true},
		{"one device on mqtt", ota.Config{TransportFor: map[string]ota.Transport{"02:00:00:00:00:01": ota.TransportMQTT}}, true},
		{"ota websocket", ota.Config{}, false},
		{"endpoint given", ota.Config{Transport: ota.TransportMQTT, MQTTEndpoint: "mqtt.lan:8883"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &hostiletest.Logs{}
			startGateway(t, Config{MQTTAddr: "127.0.0.1:0", Logger: logs.Logger(), Provisioning: Provisioning{OTA: tc.ota},
				MQTTTLS: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
			if got := strings.Contains(logs.String(), warning); got != tc.warn {
				t.Errorf("warned %v, want %v:\n%s", got, tc.warn, logs)
			}
		})
	}
	for _, c := range []struct {
		port string
		tls  bool
		want string // in the message, "" none
	}{{"8883", true, ""}, {"1883", false, ""}, {"44011", true, "plain TCP"}, {"8883", false, "does not speak"}} {
		if got := mqttPortTLSMismatch(c.port, c.tls); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("mqttPortTLSMismatch(%s, %v) = %q, want %q", c.port, c.tls, got, c.want)
		}
	}
}
