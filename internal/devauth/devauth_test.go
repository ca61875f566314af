package devauth

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

var secret = []byte("0123456789abcdef0123456789abcdef")

func newAuth(t testing.TB, now *time.Time) *Authority {
	t.Helper()
	a, err := New(Config{Secret: secret, Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestVerify(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a := newAuth(t, &now)
	const dev, cli = "02:00:00:00:00:01", "c-1"
	tok, err := a.IssueDevice("02-00-00-00-00-01", cli, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	anyClient, _ := a.IssueDevice(dev, "", time.Hour)
	vis, _ := a.IssueVision(dev, time.Hour)
	other, _ := New(Config{Secret: []byte(strings.Repeat("x", 32))})
	forged, _ := other.IssueDevice(dev, cli, time.Hour)
	// "BA", not "AB": the last character has 2 unused bits, and only its
	// canonical spelling is a signature at all (anything else is malformed).
	flipped := tok[:len(tok)-2] + map[bool]string{true: "AA", false: "BA"}[!strings.HasSuffix(tok, "AA")]

	tests := []struct {
		name, dev, cli, tok string
		want                error
	}{
		{"valid", dev, cli, tok, nil},
		{"valid, other MAC form", "02:00:00:00:00:01", cli, tok, nil},
		{"unbound client id", dev, "anything", anyClient, nil},
		{"client id in another case", dev, "C-1", tok, nil},
		{"wrong device", "02:00:00:00:00:02", cli, tok, ErrWrongDevice},
		{"wrong client", dev, "c-2", tok, ErrWrongClient},
		{"missing", dev, cli, "", ErrMissing},
		{"malformed", dev, cli, "hello", ErrMalformed},
		{"malformed base64", dev, cli, "mgd1.!!!.###", ErrMalformed},
		{"no signature part", dev, cli, "mgd1.abc", ErrMalformed},
		{"bad signature", dev, cli, flipped, ErrBadSig},
		{"other secret", dev, cli, forged, ErrBadSig},
		{"vision token as device token", dev, cli, vis, ErrWrongKind},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := a.Verify(tt.dev, tt.cli, tt.tok); !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
		})
	}
	if err := a.VerifyVision(dev, tok); !errors.Is(err, ErrWrongKind) {
		t.Errorf("device token as vision token: %v", err)
	}
	if err := a.VerifyVision(dev, vis); err != nil {
		t.Errorf("vision token: %v", err)
	}
}

func TestExpiryAndRevocation(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a := newAuth(t, &now)
	const dev = "02:00:00:00:00:01"
	tok, _ := a.IssueDevice(dev, "c", time.Hour)
	now = now.Add(time.Hour)
	if err := a.Verify(dev, "c", tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired: %v", err)
	}
	now = now.Add(-30 * time.Minute)
	if err := a.Verify(dev, "c", tok); err != nil {
		t.Fatalf("before expiry: %v", err)
	}
	if err := a.Revoke(tok); err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(dev, "c", tok); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	t2, _ := a.IssueDevice(dev, "c", time.Hour)
	if _, err := a.RevokeDevice(dev); err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(dev, "c", t2); !errors.Is(err, ErrRevoked) {
		t.Fatalf("device revoked: %v", err)
	}
	now = now.Add(time.Second)
	t3, _ := a.IssueDevice(dev, "c", time.Hour)
	if err := a.Verify(dev, "c", t3); err != nil {
		t.Fatalf("token issued after RevokeDevice: %v", err)
	}
}

// Revocations returned by RevokeToken and RevokeDevice, restored into a
// fresh Authority (a restarted gateway), revoke the same tokens and only them.
func TestRestoreRevocations(t *testing.T) {
	now := time.Now()
	a := newAuth(t, &now)
	const dev, other = "02:00:00:00:00:01", "02:00:00:00:00:02"
	one, _ := a.IssueDevice(dev, "c", time.Hour)
	old, _ := a.IssueDevice(other, "c", time.Hour)
	tokRev, err := a.RevokeToken(one)
	if err != nil {
		t.Fatal(err)
	}
	if tokRev.DeviceID != dev || tokRev.TokenID == "" || tokRev.ExpiresMS <= now.UnixMilli() {
		t.Fatalf("token revocation %+v", tokRev)
	}
	devRev, err := a.RevokeDevice(other)
	if err != nil {
		t.Fatal(err)
	}
	if devRev.DeviceID != other || devRev.TokenID != "" || devRev.IssuedBeforeMS != now.UnixMilli() {
		t.Fatalf("device revocation %+v", devRev)
	}
	now = now.Add(time.Millisecond)
	fresh, _ := a.IssueDevice(other, "c", time.Hour)
	kept, _ := a.IssueDevice(dev, "c", time.Hour)

	b := newAuth(t, &now)
	b.Restore([]Revocation{tokRev, devRev, {DeviceID: "not an id"}, {TokenID: "gone", ExpiresMS: now.Add(-time.Hour).UnixMilli()}})
	for _, tc := range []struct {
		name, dev, tok string
		want           error
	}{
		{"revoked token", dev, one, ErrRevoked},
		{"token of a revoked device", other, old, ErrRevoked},
		{"token issued after the device revocation", other, fresh, nil},
		{"another token of the device", dev, kept, nil},
	} {
		if err := b.Verify(tc.dev, "c", tc.tok); !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
			t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
		}
	}
	b.mu.Lock()
	_, stale := b.revoked["gone"]
	b.mu.Unlock()
	if stale {
		t.Error("an expired token revocation was restored")
	}
}

func TestVerifyMQTT(t *testing.T) {
	now := time.Now()
	a := newAuth(t, &now)
	tok, _ := a.IssueDevice("02:00:00:00:00:01", "uuid-1", time.Hour)
	const cid = "GID_mcpgate@@@02_00_00_00_00_01@@@uuid-1"
	tests := []struct {
		name, cid, user, pass string
		want                  error
	}{
		{"valid", cid, "02:00:00:00:00:01", tok, nil},
		{"wrong username", cid, "02:00:00:00:00:02", tok, ErrWrongDevice},
		{"other device's client id", "GID_x@@@02_00_00_00_00_02@@@uuid-1", "02:00:00:00:00:02", tok, ErrWrongDevice},
		{"wrong uuid", "GID_x@@@02_00_00_00_00_01@@@uuid-2", "02:00:00:00:00:01", tok, ErrWrongClient},
		{"malformed client id", "device-1", "02:00:00:00:00:01", tok, ErrMalformed},
		{"malformed password", cid, "02:00:00:00:00:01", "secret", ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := a.VerifyMQTT(tt.cid, tt.user, tt.pass); !errors.Is(err, tt.want) {
				t.Fatalf("VerifyMQTT = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestLoadOrCreateSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "device-secret")
	s1, err := LoadOrCreateSecret(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file mode %v, want 0600", fi.Mode().Perm())
	}
	s2, err := LoadOrCreateSecret(path, nil)
	if err != nil || string(s1) != string(s2) {
		t.Fatalf("second load: %q, %v; want the same secret", s2, err)
	}
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("abc"), 0o600)
	if _, err := LoadOrCreateSecret(short, nil); err == nil {
		t.Error("a 3-byte secret was accepted")
	}
}

// A new secret that cannot be written (a full disk) leaves no file behind,
// so the next start, with room again, creates it; a file too short to be a
// secret is refused with how to recover.
func TestLoadOrCreateSecretFailedWriteLeavesNoFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "device-secret")
	writeSecret = func(f *os.File, b []byte) (int, error) { return 0, syscall.ENOSPC }
	_, err := LoadOrCreateSecret(path, nil)
	writeSecret = (*os.File).Write
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("LoadOrCreateSecret on a full disk: %v, want ENOSPC", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("a failed write left %v", left)
	}
	s, err := LoadOrCreateSecret(path, nil)
	if err != nil || len(s) != 64 {
		t.Fatalf("start with room again: %q, %v", s, err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Errorf("files left: %v, want the secret alone", left)
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	if _, err := LoadOrCreateSecret(empty, nil); err == nil || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("an empty secret file: %v, want how to recover", err)
	}
}

// An existing secret file that group or others may read is made 0600,
// with a warning naming the file and its old mode but not the secret; a
// private one is read without a word.
func TestLoadOrCreateSecretTightensExisting(t *testing.T) {
	const want = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660, 0o600, 0o400} {
		t.Run(mode.String(), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "device-secret")
			if err := os.WriteFile(path, []byte(want+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, mode); err != nil { // WriteFile's mode passes through the umask
				t.Fatal(err)
			}
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			got, err := LoadOrCreateSecret(path, log)
			if err != nil || string(got) != want {
				t.Fatalf("LoadOrCreateSecretLog = %q, %v; want the file's secret", got, err)
			}
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			loose := mode&0o077 != 0
			wantMode := mode
			if loose {
				wantMode = 0o600
			}
			if fi.Mode().Perm() != wantMode {
				t.Errorf("mode after load %v, want %v", fi.Mode().Perm(), wantMode)
			}
			warned := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "made it private") &&
				strings.Contains(buf.String(), path) && strings.Contains(buf.String(), fmt.Sprintf("was=%#o", mode))
			if warned != loose {
				t.Errorf("warned %v, want %v; log:\n%s", warned, loose, buf.String())
			}
			if strings.Contains(buf.String(), want[:16]) {
				t.Errorf("the secret was logged:\n%s", buf.String())
			}
			// Once private, the next start says nothing.
			buf.Reset()
			if _, err := LoadOrCreateSecret(path, log); err != nil || buf.Len() != 0 {
				t.Errorf("second load: %v, log %q", err, buf.String())
			}
		})
	}
}

func TestReasonLabels(t *testing.T) {
	if got := Reason(ErrExpired); got != "expired" {
		t.Errorf("Reason(ErrExpired) = %q", got)
	}
	if got := Reason(errors.New("x")); got != "other" {
		t.Errorf("Reason(other) = %q", got)
	}
}

// Failures are all counted, but logged at most once per interval per
// transport and reason, with the number left out.
func TestCheckerLogSampling(t *testing.T) {
	a, err := New(Config{Secret: bytes.Repeat([]byte("k"), 32)})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	c := NewChecker(a, ModeToken, slog.New(slog.NewTextHandler(&buf, nil)), nil)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	for range 5 {
		if c.WebSocket("02:00:00:00:00:01", "", "garbage") == nil {
			t.Fatal("a garbage token was accepted")
		}
	}
	if c.MQTT("GID_x@@@02_00_00_00_00_01@@@u", "u", "p") == nil {
		t.Fatal("bad MQTT credentials were accepted")
	}
	if n := strings.Count(buf.String(), "device authentication failed"); n != 2 {
		t.Fatalf("%d lines, want 2 (one per transport):\n%s", n, buf.String())
	}
	now = now.Add(logInterval)
	_ = c.WebSocket("02:00:00:00:00:01", "", "garbage")
	if !strings.Contains(buf.String(), "suppressed=4") {
		t.Fatalf("the next line should say how many were left out:\n%s", buf.String())
	}
	if n := strings.Count(buf.String(), "garbage"); n != 0 {
		t.Fatalf("the token was logged:\n%s", buf.String())
	}
}

// TestTokenNeverShorterThanTTL: expiry is whole seconds, rounded up, so a
// token issued within a second lives at least its ttl.
func TestTokenNeverShorterThanTTL(t *testing.T) {
	const dev = "02:00:00:00:00:01"
	issued := time.Unix(1_800_000_000, 800_000_000)
	now := issued
	a := newAuth(t, &now)
	tok, _ := a.IssueVision(dev, 2*time.Second)
	for _, at := range []time.Duration{1200 * time.Millisecond, 2*time.Second - time.Nanosecond} {
		now = issued.Add(at)
		if err := a.VerifyVision(dev, tok); err != nil {
			t.Fatalf("%s after issue, within its 2s: %v", at, err)
		}
	}
	now = issued.Add(2200 * time.Millisecond)
	if err := a.VerifyVision(dev, tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("at the next whole second past its ttl: %v", err)
	}
}

// renewalAuth is an Authority whose devices are connected (LastConnected
// now) while online[id] is set, else were last at seen[id].
func renewalAuth(t *testing.T, now *time.Time, online map[string]bool, seen map[string]time.Time) *Authority {
	t.Helper()
	a, err := New(Config{Secret: secret, Now: func() time.Time { return *now },
		LastConnected: func(id string) time.Time {
			if online[id] {
				return *now
			}
			return seen[id]
		}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A device token that authenticated its device's last connection stays
// valid past its claims' expiry while that connection is alive, and for
// its lifetime after it ended; unused for its lifetime, it expires.
func TestTokenRenewedByUse(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	now := start
	const dev = "02:00:00:00:00:01"
	online, seen := map[string]bool{}, map[string]time.Time{}
	a := renewalAuth(t, &now, online, seen)
	tok, _ := a.IssueDevice(dev, "c", time.Hour)
	unused, _ := a.IssueDevice(dev, "c", time.Hour)
	if err := a.Verify(dev, "c", tok); err != nil {
		t.Fatal(err)
	}
	online[dev] = true // connected for 31 hours
	now = start.Add(31 * time.Hour)
	if err := a.Verify(dev, "c", tok); err != nil {
		t.Fatalf("token in use, reconnecting past its expiry: %v", err)
	}
	if err := a.Verify(dev, "c", unused); !errors.Is(err, ErrExpired) {
		t.Fatalf("another token of the device, never used: %v, want expired", err)
	}
	if err := a.Verify(dev, "c", tok); err != nil {
		t.Fatalf("token in use again: %v", err)
	}
	online[dev], seen[dev] = false, now // disconnected
	now = now.Add(59 * time.Minute)
	if err := a.Verify(dev, "c", tok); err != nil {
		t.Fatalf("59 min after its last use: %v", err)
	}
	online[dev], seen[dev] = false, now
	now = now.Add(time.Hour)
	if err := a.Verify(dev, "c", tok); !errors.Is(err, ErrExpired) || Reason(err) != "expired" {
		t.Fatalf("unused for its lifetime: %v, want expired", err)
	}
	if err := a.VerifyVision(dev, tok); !errors.Is(err, ErrWrongKind) {
		t.Fatalf("as a vision token: %v", err)
	}
}

// A revoked token in use is never renewed, whether revoked alone or with
// every token of its device, before or after a restart.
func TestRevokedTokenStaysRevoked(t *testing.T) {
	for _, whole := range []bool{false, true} {
		t.Run(fmt.Sprintf("device=%t", whole), func(t *testing.T) {
			start := time.Unix(1_800_000_000, 0)
			now := start
			const dev = "02:00:00:00:00:01"
			online, seen := map[string]bool{dev: true}, map[string]time.Time{}
			a := renewalAuth(t, &now, online, seen)
			tok, _ := a.IssueDevice(dev, "c", time.Hour)
			if err := a.Verify(dev, "c", tok); err != nil {
				t.Fatal(err)
			}
			now = start.Add(2 * time.Hour)
			var rev Revocation
			var err error
			if whole {
				rev, err = a.RevokeDevice(dev)
			} else {
				rev, err = a.RevokeToken(tok)
			}
			if err != nil {
				t.Fatal(err)
			}
			// What a restart reads back: the store forgets a revoked token
			// in use with the revocation (store.AddRevocation).
			if got := a.TokenInUse(dev); got != "" {
				t.Fatalf("token in use after its revocation: %q, want none", got)
			}
			for _, after := range []time.Duration{0, 59 * time.Minute, 48 * time.Hour} {
				now = start.Add(2*time.Hour + after)
				if err := a.Verify(dev, "c", tok); err == nil {
					t.Fatalf("revoked token accepted %s after its revocation", after)
				}
				// A restart, with the revocations still in force then.
				b := renewalAuth(t, &now, online, seen)
				b.RestoreTokenInUse(dev, a.TokenInUse(dev))
				if rev.TokenID == "" || rev.ExpiresMS > now.UnixMilli() {
					b.Restore([]Revocation{rev})
				}
				if err := b.Verify(dev, "c", tok); err == nil {
					t.Fatalf("revoked token accepted %s after its revocation, after a restart", after)
				}
			}
		})
	}
}

// The token in use, restored into a fresh Authority (a restarted gateway),
// is renewed as before the restart.
func TestTokenInUseSurvivesRestart(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	now := start
	const dev = "02:00:00:00:00:01"
	online, seen := map[string]bool{dev: true}, map[string]time.Time{}
	a := renewalAuth(t, &now, online, seen)
	tok, _ := a.IssueDevice(dev, "c", time.Hour)
	if err := a.Verify(dev, "c", tok); err != nil {
		t.Fatal(err)
	}
	now = start.Add(3 * time.Hour)
	online[dev], seen[dev] = false, now // the gateway stops
	b := renewalAuth(t, &now, online, seen)
	if err := b.Verify(dev, "c", tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("without the token in use: %v, want expired", err)
	}
	b.RestoreTokenInUse(dev, a.TokenInUse(dev))
	now = now.Add(time.Minute)
	if err := b.Verify(dev, "c", tok); err != nil {
		t.Fatalf("restored token in use: %v", err)
	}
}

// In a cluster a node renews the token in use another node stored
// (Config.StoredTokenInUse): a device left on past its token's expiry may
// reconnect to any node. A token the store does not name, or one revoked,
// is not renewed.
func TestTokenRenewedFromStore(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	now := start
	const dev = "02:00:00:00:00:01"
	holder := renewalAuth(t, &now, nil, nil)
	tok, _ := holder.IssueDevice(dev, "c", time.Hour)
	if err := holder.Verify(dev, "c", tok); err != nil {
		t.Fatal(err)
	}
	stored := holder.TokenInUse(dev) // what the holder wrote to the store
	asked := 0
	other, err := New(Config{Secret: secret, Now: func() time.Time { return now },
		LastConnected:    func(string) time.Time { return now }, // connected to the holder all along
		StoredTokenInUse: func(string) string { asked++; return stored }})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Verify(dev, "c", tok); err != nil || asked != 0 {
		t.Fatalf("before its expiry: %v, store asked %d times, want no error and no store read", err, asked)
	}
	now = start.Add(31 * time.Hour)
	if err := other.Verify(dev, "c", tok); err != nil {
		t.Fatalf("the stored token in use, on another node past its expiry: %v", err)
	}
	stored = "another"
	if err := renewalOther(t, &now, &stored).Verify(dev, "c", tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("a token the store does not name: %v, want expired", err)
	}
	stored = holder.TokenInUse(dev)
	if _, err := other.RevokeToken(tok); err != nil {
		t.Fatal(err)
	}
	if err := other.Verify(dev, "c", tok); !errors.Is(err, ErrRevoked) {
		t.Fatalf("a revoked token the store still names: %v, want revoked", err)
	}
}

// renewalOther is an Authority of another node, connected to nothing, whose
// store names *stored as the device's token in use.
func renewalOther(t *testing.T, now *time.Time, stored *string) *Authority {
	t.Helper()
	a, err := New(Config{Secret: secret, Now: func() time.Time { return *now },
		LastConnected:    func(string) time.Time { return *now },
		StoredTokenInUse: func(string) string { return *stored }})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
