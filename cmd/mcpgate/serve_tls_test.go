package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate valid until notAfter and its
// key to dir, and returns their paths.
func writeCert(t *testing.T, dir string, notAfter time.Time) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: notAfter.Add(-365 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestServeWarnsOfMQTTCertExpiry: an MQTT TLS certificate that has expired,
// or expires within 14 days, is warned of at start, naming its file and
// expiry; one valid longer is not.
func TestServeWarnsOfMQTTCertExpiry(t *testing.T) {
	for _, tc := range []struct {
		name string
		left time.Duration
		want string // "" for no warning
	}{
		{"expired", -time.Hour, "the MQTT TLS certificate has expired"},
		{"expires in 3 days", 3 * 24 * time.Hour, "the MQTT TLS certificate expires soon"},
		{"valid a year", 365 * 24 * time.Hour, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cert, key := writeCert(t, dir, time.Now().Add(tc.left).Truncate(time.Second))
			// Stopped at once: the warning comes before the gateway starts.
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			r := runContext(ctx, "http://127.0.0.1:1", "serve", "--addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0",
				"--data", filepath.Join(dir, "data"), "--mqtt-tls-cert", cert, "--mqtt-tls-key", key)
			warned := strings.Contains(r.stderr, "MQTT TLS certificate")
			switch {
			case r.code != 0:
				t.Fatalf("exit %d:\n%s", r.code, r.stderr)
			case tc.want == "" && warned:
				t.Errorf("warned of a certificate valid a year:\n%s", r.stderr)
			case tc.want != "" && (!strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "file="+cert) || !strings.Contains(r.stderr, "not_after=")):
				t.Errorf("stderr:\n%s\nwant %q naming %s and its expiry", r.stderr, tc.want, cert)
			}
		})
	}
}
