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
	"sync"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/hub"
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
