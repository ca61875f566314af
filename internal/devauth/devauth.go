// Package devauth issues and verifies device credentials: HMAC-SHA256 signed
// tokens bound to a device id (and, for device tokens, a client id), with an
// expiry, revocable while the gateway runs.
//
// Two kinds of token share one secret but never one purpose: a device token
// opens a device session (WebSocket bearer token, MQTT password), a vision
// token lets a device upload photos. A token of one kind is refused as the
// other.
//
// # Format
//
//	mgd1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "mgd1."+claims))>
//
// The claims are {"p": purpose, "d": device id, "c": client id, "i": issued
// at, "e": expires at (unix seconds, rounded up), "n": random token id}. Tokens are not
// secret from their device, only unforgeable.
//
// # Expiry
//
// A token expires at its claims' expiry, except a device token in use: one
// that authenticated its device's last connection, which was alive less
// than the token's lifetime (e - i) ago, stays valid (Config.LastConnected).
// Firmware fetches a token only at boot, so a device left on for longer than
// the lifetime reconnects after a network blip with the token it has. The
// token in use of each device is kept by the caller ([Authority.TokenInUse],
// [Authority.RestoreTokenInUse]); the gateway keeps it with the device in its
// store.
//
// # Revocation
//
// Revoke one token, or every token of a device issued until now with
// RevokeDevice. Revocations live in memory; both return the [Revocation]
// for the caller to persist, and [Authority.Restore] loads persisted ones
// at start (the gateway keeps them in its store).
//
// An Authority is safe for concurrent use.
package devauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Mode says whether devices must present a token.
type Mode string

// Modes of device authentication.
const (
	ModeOpen  Mode = "open"  // any device may connect; tokens are issued but not required
	ModeToken Mode = "token" // devices must present a valid device token
)

// ParseMode parses --device-auth.
func ParseMode(s string) (Mode, error) {
	switch Mode(strings.ToLower(strings.TrimSpace(s))) {
	case "", ModeOpen:
		return ModeOpen, nil
	case ModeToken:
		return ModeToken, nil
	}
	return "", fmt.Errorf("device auth %q: want open or token", s)
}

// Purposes of tokens.
const (
	PurposeDevice = "device"
	PurposeVision = "vision"
)

// Errors of Verify, one per reason; Reason turns them into metric labels.
var (
	ErrMissing     = errors.New("no token presented")
	ErrMalformed   = errors.New("malformed token")
	ErrBadSig      = errors.New("token signature does not match")
	ErrExpired     = errors.New("token expired")
	ErrRevoked     = errors.New("token revoked")
	ErrWrongDevice = errors.New("token belongs to another device")
	ErrWrongClient = errors.New("token belongs to another client id")
	ErrWrongKind   = errors.New("token is not valid for this use")
)

// Reason returns the metric label of a Verify error.
func Reason(err error) string {
	for _, r := range []struct {
		err   error
		label string
	}{
		{ErrMissing, "missing"}, {ErrMalformed, "malformed"}, {ErrBadSig, "bad_signature"},
		{ErrExpired, "expired"}, {ErrRevoked, "revoked"}, {ErrWrongDevice, "wrong_device"},
		{ErrWrongClient, "wrong_client"}, {ErrWrongKind, "wrong_kind"},
	} {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "other"
}

const prefix = "mgd1."

// MinSecretLen is the shortest accepted secret.
const MinSecretLen = 32

// Claims are what a token says.
type Claims struct {
	Purpose  string `json:"p"`
	DeviceID string `json:"d"`
	ClientID string `json:"c,omitempty"` // empty: any client id of the device
	IssuedAt int64  `json:"i"`           // unix milliseconds, so a re-issue right after a revocation is valid
	Expires  int64  `json:"e"`
	ID       string `json:"n"`
}

// Config configures an Authority.
type Config struct {
	// Secret signs tokens; at least MinSecretLen bytes. Required.
	Secret []byte
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// LastConnected returns when a device was last connected: the current
	// time while it is, the zero time when unknown. It is asked only of a
	// device token past its claims' expiry, which stays valid while in use
	// (see Expiry). Nil: every token expires at its claims' expiry.
	LastConnected func(deviceID string) time.Time
	// StoredTokenInUse returns the id of a device's token in use as the
	// node holding it stored it, "" when unknown. It is asked only of a
	// device token past its claims' expiry that is not this Authority's
	// token in use of the device: in a cluster, another node may have seen
	// the device's last connections. Nil: this Authority's alone.
	StoredTokenInUse func(deviceID string) string
}

// Authority issues and verifies tokens.
type Authority struct {
	secret        atomic.Pointer[[]byte] // SetSecret replaces it
	now           func() time.Time
	lastConnected func(deviceID string) time.Time // nil: no renewal; never called with mu held
	storedInUse   func(deviceID string) string    // nil: none; never called with mu held

	mu         sync.Mutex
	revoked    map[string]int64  // token id → its expiry (forgotten after it)
	revokedDev map[string]int64  // device id → tokens issued at or before this unix millisecond are revoked
	inUse      map[string]string // device id → id of the device token that authenticated it last
}

// New returns an Authority signing with cfg.Secret.
func New(cfg Config) (*Authority, error) {
	if len(cfg.Secret) < MinSecretLen {
		return nil, fmt.Errorf("devauth: secret is %d bytes, want at least %d", len(cfg.Secret), MinSecretLen)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Authority{now: cfg.Now, lastConnected: cfg.LastConnected, storedInUse: cfg.StoredTokenInUse, revoked: make(map[string]int64),
		revokedDev: make(map[string]int64), inUse: make(map[string]string)}
	a.secret.Store(new(bytes.Clone(cfg.Secret)))
	return a, nil
}

// SetSecret replaces the signing secret: tokens signed with the old one no
// longer verify. A cluster node takes the cluster's secret from the store
// this way once it is open, before it serves.
func (a *Authority) SetSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("devauth: secret is %d bytes, want at least %d", len(secret), MinSecretLen)
	}
	a.secret.Store(new(bytes.Clone(secret)))
	return nil
}

// Derive returns a key for purpose, derived from the secret: another use of
// it (sealing OAuth codes) without handing the secret out.
func (a *Authority) Derive(purpose string) []byte {
	m := hmac.New(sha256.New, *a.secret.Load())
	m.Write([]byte("mcpgate: derived key: " + purpose))
	return m.Sum(nil)
}

// Mark returns a fingerprint of the secret (SecretMark).
func (a *Authority) Mark() string { return SecretMark(*a.secret.Load()) }

// IssueDevice returns a device token for deviceID, bound to clientID (empty
// binds it to none), valid for ttl.
func (a *Authority) IssueDevice(deviceID, clientID string, ttl time.Duration) (string, error) {
	return a.issue(PurposeDevice, deviceID, clientID, ttl)
}

// IssueVision returns a vision (photo upload) token for deviceID, valid for ttl.
func (a *Authority) IssueVision(deviceID string, ttl time.Duration) (string, error) {
	return a.issue(PurposeVision, deviceID, "", ttl)
}

func (a *Authority) issue(purpose, deviceID, clientID string, ttl time.Duration) (string, error) {
	id, err := xiaozhi.NormalizeDeviceID(deviceID)
	if err != nil {
		return "", fmt.Errorf("devauth: %w", err)
	}
	if ttl <= 0 {
		return "", fmt.Errorf("devauth: token lifetime must be positive, got %s", ttl)
	}
	var n [12]byte
	_, _ = rand.Read(n[:]) // crypto/rand.Read never fails
	now := a.now()
	// Expiry is in whole seconds, rounded up: a token never lives less
	// than ttl (rounded down, a 2 s token issued at .8 expired 1.2 s later).
	exp := now.Add(ttl)
	expires := exp.Unix()
	if exp.Nanosecond() != 0 {
		expires++
	}
	c := Claims{Purpose: purpose, DeviceID: id, ClientID: clientID, IssuedAt: now.UnixMilli(),
		Expires: expires, ID: hex.EncodeToString(n[:])}
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("devauth: %w", err)
	}
	payload := prefix + base64.RawURLEncoding.EncodeToString(body)
	return payload + "." + base64.RawURLEncoding.EncodeToString(a.sign(payload)), nil
}

// SecretMark returns a fingerprint of a secret: equal for equal secrets,
// and telling nothing of the secret. Cluster nodes compare theirs, since a
// node with another secret refuses the tokens the others issue.
func SecretMark(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("mcpgate: device secret mark"))
	return hex.EncodeToString(m.Sum(nil)[:12])
}

func (a *Authority) sign(payload string) []byte {
	m := hmac.New(sha256.New, *a.secret.Load())
	m.Write([]byte(payload))
	return m.Sum(nil)
}

// Parse checks a token's signature and returns its claims, without checking
// expiry, revocation or binding.
func (a *Authority) Parse(token string) (Claims, error) {
	var c Claims
	if token == "" {
		return c, ErrMissing
	}
	if !strings.HasPrefix(token, prefix) || len(token) > 1024 {
		return c, ErrMalformed
	}
	payload, sig64, ok := strings.Cut(token[len(prefix):], ".")
	if !ok {
		return c, ErrMalformed
	}
	sig, err := base64.RawURLEncoding.DecodeString(sig64)
	// Only the canonical encoding: the decoder skips line breaks and
	// ignores the last character's unused bits, which would let one valid
	// token be presented under many spellings.
	if err != nil || base64.RawURLEncoding.EncodeToString(sig) != sig64 {
		return c, ErrMalformed
	}
	// Constant time: the comparison must not tell a forger how many bytes
	// of a guessed signature are right.
	if !hmac.Equal(sig, a.sign(prefix+payload)) {
		return c, ErrBadSig
	}
	body, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(body, &c) != nil || c.DeviceID == "" || c.ID == "" {
		return Claims{}, ErrMalformed
	}
	return c, nil
}

// Verify checks a device token presented by deviceID with clientID. It is
// the credential check of every transport: a WebSocket bearer token, an MQTT
// password.
func (a *Authority) Verify(deviceID, clientID, token string) error {
	c, err := a.check(PurposeDevice, deviceID, token)
	if err != nil {
		return err
	}
	// Client ids are UUIDs, whose case means nothing: compared as the OTA
	// endpoint compares them (gateway.boundElsewhere). They are not secret:
	// a plain comparison leaks nothing.
	if c.ClientID != "" && !strings.EqualFold(c.ClientID, clientID) {
		return ErrWrongClient
	}
	a.mu.Lock()
	a.inUse[c.DeviceID] = c.ID
	a.mu.Unlock()
	return nil
}

// TokenInUse returns the id of the device token that last authenticated
// deviceID (normalised), "" when none did since the start or a revocation.
func (a *Authority) TokenInUse(deviceID string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inUse[deviceID]
}

// RestoreTokenInUse makes tokenID the token in use of deviceID
// (normalised), as TokenInUse returned it before a restart. A token
// revoked since stays revoked.
func (a *Authority) RestoreTokenInUse(deviceID, tokenID string) {
	if tokenID == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.inUse[deviceID]; !ok {
		a.inUse[deviceID] = tokenID
	}
}

// VerifyVision checks a vision token presented by deviceID.
func (a *Authority) VerifyVision(deviceID, token string) error {
	_, err := a.check(PurposeVision, deviceID, token)
	return err
}

// VerifyMQTT checks MQTT CONNECT credentials as the OTA endpoint hands them
// out: client id GID_<group>@@@<mac_underscores>@@@<uuid>, username the
// device id, password a device token.
func (a *Authority) VerifyMQTT(clientID, username, password string) error {
	deviceID, uuid, err := ParseMQTTClientID(clientID)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if u, err := xiaozhi.NormalizeDeviceID(username); err != nil || u != deviceID {
		return ErrWrongDevice
	}
	return a.Verify(deviceID, uuid, password)
}

// ParseMQTTClientID splits GID_<group>@@@<mac_underscores>@@@<uuid> into the
// normalised device id and the uuid, as the broker reads it
// (xiaozhi.ParseMQTTClientID): the credentials and the session agree on
// which device connected.
func ParseMQTTClientID(clientID string) (deviceID, uuid string, err error) {
	id, err := xiaozhi.ParseMQTTClientID(clientID)
	if err != nil {
		return "", "", err
	}
	return id.DeviceID, id.UUID, nil
}

func (a *Authority) check(purpose, deviceID, token string) (Claims, error) {
	c, err := a.Parse(token)
	if err != nil {
		return c, err
	}
	if c.Purpose != purpose {
		return c, ErrWrongKind
	}
	id, err := xiaozhi.NormalizeDeviceID(deviceID)
	if err != nil || id != c.DeviceID {
		return c, ErrWrongDevice
	}
	now := a.now()
	if now.Unix() >= c.Expires && !a.renewed(c, now) {
		return c, ErrExpired
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.revoked[c.ID]; ok {
		return c, ErrRevoked
	}
	if cut, ok := a.revokedDev[c.DeviceID]; ok && c.IssuedAt <= cut {
		return c, ErrRevoked
	}
	return c, nil
}

// renewed reports whether c, past its claims' expiry, is a device token in
// use (see Expiry), here or as stored by the node that saw it in use.
func (a *Authority) renewed(c Claims, now time.Time) bool {
	if c.Purpose != PurposeDevice || a.lastConnected == nil {
		return false
	}
	if a.TokenInUse(c.DeviceID) != c.ID && (a.storedInUse == nil || a.storedInUse(c.DeviceID) != c.ID) {
		return false
	}
	seen := a.lastConnected(c.DeviceID)
	return !seen.IsZero() && now.Sub(seen) < c.lifetime()
}

// lifetime is the lifetime the token was issued with.
func (c Claims) lifetime() time.Duration {
	return time.Duration(c.Expires*1000-c.IssuedAt) * time.Millisecond
}

// Revocation is one revocation in a form a store keeps: every token of
// DeviceID issued at or before IssuedBeforeMS (unix milliseconds) when
// TokenID is empty, otherwise the one token TokenID, which expires anyway at
// ExpiresMS.
type Revocation struct {
	DeviceID       string
	TokenID        string
	IssuedBeforeMS int64
	ExpiresMS      int64
}

// Revoke revokes one token (any validly signed token, expired or not).
func (a *Authority) Revoke(token string) error {
	_, err := a.RevokeToken(token)
	return err
}

// RevokeToken revokes one token, like Revoke, and returns the revocation
// to persist.
func (a *Authority) RevokeToken(token string) (Revocation, error) {
	c, err := a.Parse(token)
	if err != nil {
		return Revocation{}, err
	}
	// A token in use outlives its claims' expiry by up to its lifetime
	// after its last use, at the latest now: the revocation is kept as long.
	exp := max(c.Expires, a.now().Add(c.lifetime()).Unix()+1)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pruneLocked()
	a.revoked[c.ID] = exp
	if a.inUse[c.DeviceID] == c.ID {
		delete(a.inUse, c.DeviceID)
	}
	return Revocation{DeviceID: c.DeviceID, TokenID: c.ID, ExpiresMS: exp * 1000}, nil
}

// RevokeDevice revokes every token of deviceID issued until now; tokens
// issued from the next millisecond on are valid. It returns the
// revocation to persist.
func (a *Authority) RevokeDevice(deviceID string) (Revocation, error) {
	id, err := xiaozhi.NormalizeDeviceID(deviceID)
	if err != nil {
		return Revocation{}, fmt.Errorf("devauth: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	cut := a.now().UnixMilli()
	a.revokedDev[id] = cut
	delete(a.inUse, id)
	return Revocation{DeviceID: id, IssuedBeforeMS: cut}, nil
}

// Restore puts persisted revocations back in force, as they were when
// revoked. A device revocation only ever moves its cut later; token
// revocations already past their expiry are skipped.
func (a *Authority) Restore(revs []Revocation) {
	a.mu.Lock()
	defer a.mu.Unlock()
	nowMS := a.now().UnixMilli()
	for _, r := range revs {
		switch {
		case r.TokenID != "":
			if r.ExpiresMS > nowMS {
				a.revoked[r.TokenID] = r.ExpiresMS / 1000
			}
		case r.DeviceID != "":
			id, err := xiaozhi.NormalizeDeviceID(r.DeviceID)
			if err != nil {
				continue
			}
			if r.IssuedBeforeMS > a.revokedDev[id] {
				a.revokedDev[id] = r.IssuedBeforeMS
			}
		}
	}
}

// pruneLocked forgets revoked tokens that have expired anyway, so the list
// stays as small as the set of live revoked tokens.
func (a *Authority) pruneLocked() {
	now := a.now().Unix()
	for id, exp := range a.revoked {
		if now >= exp {
			delete(a.revoked, id)
		}
	}
}

// LoadOrCreateSecret reads the secret file at path, or creates it (mode
// 0600, its directory 0700) with 32 random bytes, hex encoded, if it does not
// exist. An existing file that group or others may read or write is made
// mode 0600 with a warning on log (nil: no log): whoever reads it can
// mint tokens for any device. When that fails (a read-only mount, another
// owner) the secret is still used, with a warning saying so.
func LoadOrCreateSecret(path string, log *slog.Logger) ([]byte, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, err := readSecret(path, log)
	if err == nil {
		s := bytes.TrimSpace(b)
		if len(s) < MinSecretLen {
			return nil, fmt.Errorf("device secret file %s holds %d bytes, want at least %d: "+
				"if no device holds a token from it (a first start that failed), delete it and start again; "+
				"else restore it from a backup, or devices must pair again", path, len(s), MinSecretLen)
		}
		return s, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("device secret: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("device secret: %w", err)
	}
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	s := []byte(hex.EncodeToString(raw[:]))
	// Written whole to a temporary file first, then linked into place: a
	// failed write (a full disk) or a crash leaves no secret file, rather
	// than an empty one that would refuse every later start. A link, unlike
	// a rename, fails when the file exists: when two processes race to
	// create it, one wins and the other reads the winner's secret.
	tmp, err := os.CreateTemp(dir, ".device-secret-*") // mode 0600
	if err != nil {
		return nil, fmt.Errorf("device secret: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = writeSecret(tmp, append(s, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("device secret: write %s: %w", tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if _, serr := os.Lstat(path); errors.Is(err, os.ErrExist) || serr == nil {
			return LoadOrCreateSecret(path, log)
		}
		// No hard links on this file system (FAT, some network mounts): a
		// rename, which would replace a file made since the Lstat.
		if err := os.Rename(tmp.Name(), path); err != nil {
			return nil, fmt.Errorf("device secret: %w", err)
		}
	}
	// The new name survives a power cut only once its directory is synced;
	// not every system can sync a directory (Windows), hence best effort.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return s, nil
}

// writeSecret writes the new secret file; tests make it fail.
var writeSecret = (*os.File).Write

// readSecret reads an existing secret file, first making it private when
// group or others may read or write it. The mode is checked and changed on
// the open file, so a file swapped in between cannot dodge it.
func readSecret(path string, log *slog.Logger) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	// Only regular files: a directory given by mistake is left alone (the
	// read fails). Windows has no group and other bits: os.Chmod only
	// toggles read-only there, and every file reads as 0666.
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && fi.Mode().IsRegular() && runtime.GOOS != "windows" {
		if err := f.Chmod(0o600); err != nil {
			log.Warn("device secret file is open to other users and could not be made private: anyone who reads it can mint device tokens",
				"path", path, "mode", fmt.Sprintf("%#o", perm), "error", err)
		} else {
			log.Warn("device secret file was open to other users: made it private (mode 0600)",
				"path", path, "was", fmt.Sprintf("%#o", perm))
		}
	}
	return io.ReadAll(f)
}
