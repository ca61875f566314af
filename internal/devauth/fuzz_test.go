package devauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// FuzzVerifyToken feeds arbitrary strings to every check a presented token
// goes through (WebSocket bearer tokens, MQTT passwords, vision uploads).
// None may panic, every refusal must carry one of the documented reasons,
// and a token is accepted only when it is byte for byte the canonical
// token of its payload, signed with the secret: a mutated valid token
// (flipped bits, line breaks or padding bits in its base64, a changed
// claim) is refused. The fuzzer cannot forge HMAC-SHA256, so whatever
// passes beyond the seeds is malleability.
func FuzzVerifyToken(f *testing.F) {
	const dev, cli = "02:00:00:00:00:01", "6f1d9e52-0000-4000-8000-000000000001"
	mqttCID := "GID_test@@@02_00_00_00_00_01@@@" + cli
	now := time.Unix(1_800_000_000, 0)
	a := newAuth(f, &now)

	devTok, _ := a.IssueDevice(dev, cli, time.Hour)
	anyTok, _ := a.IssueDevice(dev, "", time.Hour)
	visTok, _ := a.IssueVision(dev, time.Hour)
	other, _ := New(Config{Secret: []byte(strings.Repeat("x", MinSecretLen))})
	forged, _ := other.IssueDevice(dev, cli, time.Hour)
	payload, sig, _ := strings.Cut(devTok[len(prefix):], ".")
	for _, s := range []string{
		devTok, anyTok, visTok, forged,
		// Valid signatures in non-canonical base64: the decoder skips line
		// breaks, and the last character carries 2 unused bits.
		prefix + payload + "." + sig[:10] + "\n" + sig[10:],
		prefix + payload + "." + sig + "\r\n",
		prefix + payload + "." + sig[:len(sig)-1] + string(b64url[strings.IndexByte(b64url, sig[len(sig)-1])^1]),
		prefix + payload + "." + sig + "=",
		prefix + payload + "." + base64.URLEncoding.EncodeToString(a.sign(prefix+payload)),
		prefix + payload + "." + base64.StdEncoding.EncodeToString(a.sign(prefix+payload)),
		// Claims changed, signature kept.
		prefix + payload[:len(payload)-2] + "." + sig,
		prefix + base64.RawURLEncoding.EncodeToString([]byte(`{"p":"device","d":"02:00:00:00:00:01","i":0,"e":9999999999,"n":"x"}`)) + "." + sig,
		// Validly signed, but claims that must not pass.
		mint(`{"p":"device","d":"02:00:00:00:00:01","e":9999999999}`),                      // no token id
		mint(`{"p":"device","d":"","e":9999999999,"n":"x"}`),                               // no device
		mint(`{"p":"admin","d":"02:00:00:00:00:01","e":9999999999,"n":"x"}`),               // unknown purpose
		mint(`{"p":"device","d":"02-00-00-00-00-01","e":9999999999,"n":"x"}`),              // unnormalised id
		mint(`{"p":"device","d":"02:00:00:00:00:01","e":-1,"n":"x"}`),                      // expired long ago
		mint(`{"p":"device","d":"02:00:00:00:00:01","e":1e400,"n":"x"}`),                   // out of range
		mint(`{"p":"device","d":"02:00:00:00:00:01","e":9999999999,"n":"x","p":"vision"}`), // duplicate key
		mint(`not json`), mint(``), mint(`null`), mint(`[]`),
		"", "mgd1", "mgd1.", "mgd1..", "mgd1.a.b", "mgd1.a.b.c", "MGD1." + payload + "." + sig, "Bearer " + devTok,
		" " + devTok, devTok + " ", "mgd1.\x00.\xff", "mgd1." + strings.Repeat("A", 1100) + ".x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		// A slice, not a map: a fuzz target must run the same way every
		// time, or its coverage is noise to the fuzzer.
		c, perr := a.Parse(token)
		verifyErr := a.Verify(dev, cli, token)
		checks := []struct {
			what string
			err  error
		}{
			{"Parse", perr},
			{"Verify", verifyErr},
			{"VerifyVision", a.VerifyVision(dev, token)},
			{"VerifyMQTT", a.VerifyMQTT(mqttCID, dev, token)},
		}
		for _, ch := range checks {
			what, err := ch.what, ch.err
			if what == "Parse" && err != nil {
				continue // its refusal is checked against Verify's below
			}
			if err != nil {
				if Reason(err) == "other" {
					t.Errorf("%s(%q) = %v: not one of the documented reasons", what, token, err)
				}
				continue
			}
			if want := canonical(token); token != want {
				t.Fatalf("%s accepted %q, which is not the canonical token %q of its payload", what, token, want)
			}
			if what == "Parse" {
				continue
			}
			if c.DeviceID != dev || c.Expires <= now.Unix() || c.ID == "" {
				t.Errorf("%s accepted %q with claims %+v", what, token, c)
			}
			want := PurposeDevice
			if what == "VerifyVision" {
				want = PurposeVision
			}
			if c.Purpose != want {
				t.Errorf("%s accepted a %q token", what, c.Purpose)
			}
		}
		if perr != nil && !errors.Is(verifyErr, perr) {
			t.Errorf("Parse refused %q with %v, Verify with %v", token, perr, verifyErr)
		}
	})
}

const b64url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// mint signs claims with the test secret the way a token is built,
// independently of Authority, so that the fuzzer starts from validly
// signed tokens whose claims are odd.
func mint(claims string) string {
	payload := prefix + base64.RawURLEncoding.EncodeToString([]byte(claims))
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(payload))
	return payload + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// canonical returns the one token that carries token's payload: the
// prefix, the payload and its signature in unpadded base64url.
func canonical(token string) string {
	payload, _, _ := strings.Cut(strings.TrimPrefix(token, prefix), ".")
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(prefix + payload))
	return prefix + payload + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// FuzzParseMQTTClientID: an MQTT client id comes from the network before
// any credential is checked. What parses names a normalised device id and
// the uuid that ends the client id.
func FuzzParseMQTTClientID(f *testing.F) {
	for _, s := range []string{
		"GID_test@@@02_00_00_00_00_01@@@6f1d9e52-0000-4000-8000-000000000001",
		"GID_test@@@02:00:00:00:00:01@@@",
		"GID_@@@0200000000 01@@@u",
		"GID_test@@@02_00_00_00_00_01@@@u@@@v",
		"gid_test@@@02_00_00_00_00_01@@@u",
		"GID_test@@@@@@u", "@@@", "", "GID_\x00@@@\xff@@@\xfe",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, clientID string) {
		id, uuid, err := ParseMQTTClientID(clientID)
		if err != nil {
			return
		}
		if !strings.HasPrefix(clientID, "GID_") || !strings.HasSuffix(clientID, "@@@"+uuid) || strings.Contains(uuid, "@@@") {
			t.Fatalf("%q parsed with uuid %q", clientID, uuid)
		}
		if norm, err := xiaozhi.NormalizeDeviceID(id); err != nil || norm != id {
			t.Fatalf("%q parsed as device %q, not normalised (%q, %v)", clientID, id, norm, err)
		}
	})
}
