package oauth

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// Registrations, consent requests and codes are sealed rather than kept:
// each is its own content, encrypted and authenticated (AES-256-GCM) with a
// key every node of a cluster derives from the same device secret. So any
// node, or the same one after a restart, reads what another issued, and an
// unauthenticated client makes the server hold nothing.

// Prefixes of the sealed texts, bound into each seal: one kind is never
// read as another.
const (
	clientKind  = "mcpc_"
	requestKind = "req_"
	codeKind    = "code_"
)

var (
	errUnsealed = errors.New("not one this gateway issued, or damaged")
	errExpired  = errors.New("expired")
)

type sealer struct {
	key func() []byte // 32 bytes
}

type envelope struct {
	Exp int64           `json:"e,omitempty"` // unix seconds; 0: never
	V   json.RawMessage `json:"v"`
}

func (s sealer) aead() (cipher.AEAD, error) {
	block, err := aes.NewCipher(s.key())
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal returns v sealed as kind, readable until exp (zero: always).
func (s sealer) seal(kind string, v any, exp time.Time) (string, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	env := envelope{V: body}
	if !exp.IsZero() {
		env.Exp = exp.Unix()
	}
	plain, err := json.Marshal(env)
	if err != nil {
		return "", err
	}
	a, err := s.aead()
	if err != nil {
		return "", err
	}
	nonce := make([]byte, a.NonceSize())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails (Go 1.24+)
	return kind + base64.RawURLEncoding.EncodeToString(a.Seal(nonce, nonce, plain, []byte(kind))), nil
}

// open reads into v what seal sealed as kind: errUnsealed for anything
// else, errExpired past its time.
func (s sealer) open(kind, text string, now time.Time, v any) error {
	rest, ok := strings.CutPrefix(text, kind)
	if !ok {
		return errUnsealed
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return errUnsealed
	}
	a, err := s.aead()
	if err != nil {
		return err
	}
	if len(raw) < a.NonceSize() {
		return errUnsealed
	}
	plain, err := a.Open(nil, raw[:a.NonceSize()], raw[a.NonceSize():], []byte(kind))
	if err != nil {
		return errUnsealed
	}
	var env envelope
	if err := json.Unmarshal(plain, &env); err != nil {
		return errUnsealed
	}
	if env.Exp != 0 && now.Unix() > env.Exp {
		return errExpired
	}
	if err := json.Unmarshal(env.V, v); err != nil {
		return errUnsealed
	}
	return nil
}
