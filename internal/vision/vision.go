// Package vision is the camera endpoint, POST /vision/explain: a device
// that runs self.camera.take_photo uploads the photo here out of band
// (PROTOCOL.md section 7), the gateway stores it and answers with an
// explanation from an OpenAI-compatible vision model, or, without one, a
// short JSON text naming the stored photo. The device returns a 200 body
// verbatim as the tool's result; any other status becomes its error
// "Failed to upload photo".
//
// It also serves the stored photos to REST clients (GET
// /api/v1/devices/{id}/photos and /photos/{photo}), behind the REST guard.
//
// Stored photos are bounded per device (MaxPerDevice, MaxDeviceBytes), all
// together (MaxTotalBytes) and in age (Retention), the oldest deleted
// first, at each upload and by Run's periodic Sweep; uploads are limited per
// device (UploadRate). A photo being stored or explained is never deleted.
//
// A Service is safe for concurrent use.
package vision

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/limits"
	"github.com/mcpgate/mcpgate/internal/llmerr"
	"github.com/mcpgate/mcpgate/internal/redact"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Path is where devices upload photos.
const Path = "/vision/explain"

// DefaultMaxBytes is the default largest photo.
const DefaultMaxBytes = 5 << 20

// Model is an OpenAI-compatible chat/completions endpoint with vision.
type Model struct {
	// BaseURL, e.g. https://api.openai.com/v1; chat/completions is appended
	// to its path.
	BaseURL  string
	endpoint string // set by New
	// Name is the model, e.g. gpt-4o-mini.
	Name string
	// APIKey is sent as a bearer token when set.
	APIKey string
	// Timeout bounds one explanation. Default 60s.
	Timeout time.Duration
}

// Config configures the service. Dir and Verify are required.
type Config struct {
	// Dir holds photos: Dir/<device>/<photo>.<ext> and .json metadata.
	Dir string
	// MaxBytes is the largest photo. Default DefaultMaxBytes.
	MaxBytes int64
	// Verify checks the bearer token a device presents for its id.
	Verify func(deviceID, clientID, token string) error
	// Model, when set, explains photos.
	Model *Model
	// HTTPClient calls the model; nil means http.DefaultClient's transport
	// with the model's timeout.
	HTTPClient *http.Client
	// Resolve turns a REST {id} (id in any form, or alias) into a device
	// id; nil accepts device ids only.
	Resolve func(ref string) (string, error)
	Logger  *slog.Logger
	Now     func() time.Time
	// Limits counts refused uploads (mcpgate_bad_requests_total{door="vision"},
	// mcpgate_limit_hits_total{limit="vision_body"|"vision_rate"}) and logs
	// them without flooding; nil counts in a private metrics set.
	Limits *limits.Reporter

	// Retention deletes photos older than this. Default DefaultRetention
	// (7 days); negative keeps them forever.
	Retention time.Duration
	// MaxPerDevice is the most photos kept per device: storing one more
	// deletes the oldest. Default DefaultMaxPerDevice; negative: no limit.
	MaxPerDevice int
	// MaxDeviceBytes bounds the bytes (images and metadata) kept per
	// device, the oldest deleted first. Default DefaultMaxDeviceBytes;
	// negative: no limit. At least MaxBytes. The device's newest photo is
	// kept however large its metadata.
	MaxDeviceBytes int64
	// MaxTotalBytes bounds the bytes kept for all devices together, the
	// oldest photo of any device deleted first. Default
	// DefaultMaxTotalBytes; negative: no limit. At least MaxBytes. The
	// newest photo of all is kept however large its metadata.
	MaxTotalBytes int64
	// SweepInterval is how often Run applies the bounds besides at each
	// upload. Default DefaultSweepInterval.
	SweepInterval time.Duration
	// UploadRate bounds uploads per device (token bucket, limit
	// vision_rate): over it, 429. Zero PerSecond: DefaultUploadRate;
	// negative: no limit. Burst zero: DefaultUploadBurst.
	UploadRate limits.Rate
	// Registerer, when set, gets mcpgate_photos_deleted_total{reason},
	// mcpgate_photos_stored and mcpgate_photos_bytes.
	Registerer prometheus.Registerer
}

// Service stores and explains photos.
type Service struct {
	cfg     Config
	log     *slog.Logger
	http    *http.Client
	uploads *limits.Buckets // per device; nil: no limit
	deleted *prometheus.CounterVec
	shelf   shelf
}

// New validates cfg and returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.Dir == "" || cfg.Verify == nil {
		return nil, errors.New("vision: Config.Dir and Config.Verify are required")
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("vision: MaxBytes must be positive, got %d", cfg.MaxBytes)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Limits == nil {
		cfg.Limits = limits.NewReporter(nil, cfg.Logger)
	}
	if m := cfg.Model; m != nil {
		if m.BaseURL == "" || m.Name == "" {
			return nil, errors.New("vision: a model needs a base URL and a model name")
		}
		// Checked here, not at the first photo: every photo would fail.
		u, err := url.Parse(m.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("vision: model base URL %q: want http(s)://host[:port]/path, e.g. https://api.openai.com/v1",
				redact.InText(m.BaseURL, m.BaseURL))
		}
		// The path joined, its query kept (?api-version=...).
		m.endpoint = u.JoinPath("chat/completions").String()
		if m.Timeout <= 0 {
			m.Timeout = 60 * time.Second
		}
	}
	if cfg.Resolve == nil {
		cfg.Resolve = xiaozhi.NormalizeDeviceID
	}
	if err := boundDefaults(&cfg); err != nil {
		return nil, err
	}
	c := cfg.HTTPClient
	if c == nil {
		c = &http.Client{}
	}
	s := &Service{cfg: cfg, log: cfg.Logger, http: c, uploads: limits.NewBuckets(cfg.UploadRate),
		shelf: shelf{devices: make(map[string]*shelfDevice), inUse: make(map[string]int)}}
	collectors := s.photoMetrics()
	if cfg.Registerer != nil {
		for _, c := range collectors {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("vision: metrics: %w", err)
			}
		}
	}
	return s, nil
}

// boundDefaults fills and checks the bounds on stored photos and uploads.
func boundDefaults(cfg *Config) error {
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxPerDevice == 0 {
		cfg.MaxPerDevice = DefaultMaxPerDevice
	}
	if cfg.MaxDeviceBytes == 0 {
		cfg.MaxDeviceBytes = max(DefaultMaxDeviceBytes, cfg.MaxBytes)
	}
	if cfg.MaxTotalBytes == 0 {
		cfg.MaxTotalBytes = max(DefaultMaxTotalBytes, cfg.MaxBytes)
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = DefaultSweepInterval
	}
	if cfg.UploadRate.PerSecond == 0 {
		cfg.UploadRate.PerSecond = DefaultUploadRate
	}
	if cfg.UploadRate.Burst <= 0 {
		cfg.UploadRate.Burst = DefaultUploadBurst
	}
	// A bound below the largest photo would delete each photo but the
	// newest at every upload: surely not what was meant.
	for _, b := range []struct {
		name string
		v    int64
	}{{"MaxDeviceBytes", cfg.MaxDeviceBytes}, {"MaxTotalBytes", cfg.MaxTotalBytes}} {
		if b.v > 0 && b.v < cfg.MaxBytes {
			return fmt.Errorf("vision: %s %d is below MaxBytes %d, the largest photo", b.name, b.v, cfg.MaxBytes)
		}
	}
	return nil
}

// Photo is a stored photo's metadata.
type Photo struct {
	ID          string    `json:"id"`
	DeviceID    string    `json:"device_id"`
	ClientID    string    `json:"client_id,omitempty"`
	Question    string    `json:"question,omitempty"`
	ContentType string    `json:"content_type"`
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	TakenAt     time.Time `json:"taken_at"`
	Explanation string    `json:"explanation,omitempty"`
	ModelError  string    `json:"model_error,omitempty"`
}

// uploadError is a refusal: its status, the short text a device logs, and
// a reason from a fixed set for the metric.
type uploadError struct {
	status     int
	reason     string
	msg        string
	retryAfter time.Duration // for 429
}

func (e *uploadError) Error() string { return e.msg }

func refuse(status int, reason, format string, args ...any) error {
	return &uploadError{status: status, reason: reason, msg: fmt.Sprintf(format, args...)}
}

// ServeHTTP handles one upload.
//
// Statuses: 200 with the explanation (or the stored photo's JSON, or a text
// saying the model failed: the photo was received, and the device speaks
// what it gets); 401 bad or missing token, 403 token of another device,
// 400 malformed form or headers, 413 too large, 415 not a JPEG, PNG or
// WebP image, 405 not POST, 500 storage failure. Firmware turns every
// non-200 into "Failed to upload photo".
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.cfg.Limits.BadRequest(limits.DoorVision, "http_method", "vision: upload refused", "remote", r.RemoteAddr, "method", r.Method)
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "use POST with a multipart photo", http.StatusMethodNotAllowed)
		return
	}
	answer, err := s.upload(w, r)
	if err != nil {
		var ue *uploadError
		switch {
		case !errors.As(err, &ue):
			ue = &uploadError{status: http.StatusInternalServerError, msg: "could not store the photo"}
			s.log.Error("vision: upload failed", "remote", r.RemoteAddr, "error", err)
		case ue.reason == "token":
			// devauth's Checker has logged and counted it.
		case ue.status == http.StatusRequestEntityTooLarge:
			s.cfg.Limits.Hit(limits.VisionBody, "vision: upload refused: photo over the limit",
				"remote", r.RemoteAddr, "max_bytes", s.cfg.MaxBytes, "error", ue.msg)
		case ue.status == http.StatusTooManyRequests:
			s.cfg.Limits.Hit(limits.VisionRate, "vision: upload refused: device over its upload rate",
				"remote", r.RemoteAddr, "device_id", r.Header.Get(xiaozhi.HeaderDeviceID), "retry_after", ue.retryAfter)
			w.Header().Set("Retry-After", strconv.Itoa(retrySeconds(ue.retryAfter)))
		default:
			// Rate limited: anyone who can reach the port can post garbage.
			s.cfg.Limits.BadRequest(limits.DoorVision, ue.reason, "vision: upload refused",
				"remote", r.RemoteAddr, "status", ue.status, "error", ue.msg)
		}
		http.Error(w, ue.msg, ue.status)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, answer)
}

// retrySeconds is wait in whole seconds, rounded up and at least 1: what
// both Retry-After and the refusal's text say.
func retrySeconds(wait time.Duration) int {
	return max(1, int(math.Ceil(wait.Seconds())))
}

func (s *Service) upload(w http.ResponseWriter, r *http.Request) (string, error) {
	rawID := strings.TrimSpace(r.Header.Get(xiaozhi.HeaderDeviceID))
	if rawID == "" {
		return "", refuse(http.StatusBadRequest, "missing_device_id", "missing Device-Id header")
	}
	deviceID, err := xiaozhi.NormalizeDeviceID(rawID)
	if err != nil {
		return "", refuse(http.StatusBadRequest, "bad_device_id", "invalid Device-Id header")
	}
	clientID := strings.TrimSpace(r.Header.Get(xiaozhi.HeaderClientID))
	token := strings.TrimSpace(r.Header.Get("Authorization"))
	if scheme, t, ok := strings.Cut(token, " "); ok && strings.EqualFold(scheme, "bearer") {
		token = strings.TrimSpace(t)
	}
	if err := s.cfg.Verify(deviceID, clientID, token); err != nil {
		// Verify logs and counts; the device only needs to know it was refused.
		status := http.StatusUnauthorized
		if errors.Is(err, devauth.ErrWrongDevice) {
			status = http.StatusForbidden
		}
		return "", refuse(status, "token", "vision token refused: %v", err)
	}
	// Before the body is read: a flood costs neither its bytes nor disk.
	if ok, wait := s.uploads.Allow(deviceID); !ok {
		return "", &uploadError{status: http.StatusTooManyRequests, reason: "rate", retryAfter: wait,
			msg: fmt.Sprintf("too many photos from this device: try again in %ds", retrySeconds(wait))}
	}

	// The whole body is bounded, chunked or not; multipart overhead and the
	// question get formBytes on top of the photo.
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBytes+formBytes)
	mr, err := r.MultipartReader()
	if err != nil {
		return "", refuse(http.StatusBadRequest, "not_multipart", "want a multipart/form-data body with a file part: %v", err)
	}
	var question string
	var photo []byte
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", s.readError(err)
		}
		switch part.FormName() {
		case "question":
			// Cut, not refused: firmware's questions are short, and a
			// refusal would only say "Failed to upload photo".
			b, err := io.ReadAll(io.LimitReader(part, maxQuestionBytes))
			if err != nil {
				return "", s.readError(err)
			}
			question = strings.TrimSpace(string(b))
		case "file":
			b, err := io.ReadAll(io.LimitReader(part, s.cfg.MaxBytes+1))
			if err != nil {
				return "", s.readError(err)
			}
			if int64(len(b)) > s.cfg.MaxBytes {
				return "", refuse(http.StatusRequestEntityTooLarge, "too_large", "photo is over %d bytes", s.cfg.MaxBytes)
			}
			photo = b
		default:
			_, _ = io.Copy(io.Discard, part)
		}
	}
	if photo == nil {
		return "", refuse(http.StatusBadRequest, "no_file", "the form has no file part")
	}
	ctype := sniff(photo)
	if ctype == "" {
		return "", refuse(http.StatusUnsupportedMediaType, "not_an_image", "the file is not a JPEG, PNG or WebP image")
	}
	p, err := s.store(deviceID, clientID, question, ctype, photo)
	if err != nil {
		return "", err
	}
	// Held from before it was written (store) until its metadata is final:
	// no bound deletes a photo being explained.
	defer s.release(filepath.Base(s.deviceDir(deviceID)), p.ID)
	log := s.log.With("device_id", deviceID, "photo", p.ID)
	log.Info("vision: photo stored", "bytes", p.Size, "content_type", ctype)

	if s.cfg.Model == nil {
		b, _ := json.Marshal(map[string]any{
			"photo": p.ID, "device_id": deviceID, "content_type": ctype, "size": p.Size,
			"url":     "/api/v1/devices/" + deviceID + "/photos/" + p.ID,
			"message": "photo stored; no vision model is configured",
		})
		return string(b), nil
	}
	explanation, err := s.explain(r.Context(), question, ctype, photo)
	if err != nil {
		// The upload itself worked: answer 200 so the device relays why
		// there is no explanation instead of a generic upload failure.
		log.Warn("vision: model failed", "error", err)
		p.ModelError = err.Error()
		s.saveMeta(p)
		return fmt.Sprintf("The photo was stored as %s, but the vision model could not explain it: %v", p.ID, err), nil
	}
	p.Explanation = explanation
	s.saveMeta(p)
	return explanation, nil
}

// Bounds of an upload's form besides the photo.
const (
	formBytes        = 64 << 10 // the body may be this much larger than MaxBytes
	maxQuestionBytes = 16 << 10 // a longer question is cut
)

func (s *Service) readError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		// The photo's own bound is checked when its part is read: this is
		// the rest of the form (a long question, many parts).
		return refuse(http.StatusRequestEntityTooLarge, "too_large",
			"request body is over %d bytes: the photo's bound %d plus 64 KiB for the rest of the form", tooBig.Limit, s.cfg.MaxBytes)
	}
	return refuse(http.StatusBadRequest, "malformed_multipart", "malformed multipart body: %v", err)
}

// sniff returns the content type of a JPEG, PNG or WebP by magic bytes.
func sniff(b []byte) string {
	switch {
	case len(b) >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF:
		return "image/jpeg"
	case bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png"
	case len(b) >= 12 && string(b[:4]) == "RIFF" && string(b[8:12]) == "WEBP":
		return "image/webp"
	}
	return ""
}

var exts = map[string]string{"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp"}

// photoID is <UTC time>-<random>; the pattern guards GET against path tricks.
var photoID = regexp.MustCompile(`^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$`)

// photoIDTime is the layout of a photo id's time.
const photoIDTime = "20060102T150405Z"

// deviceDir is the directory of a device's photos: a MAC as topics write it
// (02_00_00_00_00_01), any other id escaped behind a prefix no MAC form
// has, so that two ids never share one (02_00:00:00:03:01, no MAC, wrote
// into 02:00:00:00:03:01's and read its photos).
func (s *Service) deviceDir(deviceID string) string {
	if canonicalMAC.MatchString(deviceID) {
		return filepath.Join(s.cfg.Dir, xiaozhi.MACTopicForm(deviceID))
	}
	return filepath.Join(s.cfg.Dir, "id-"+url.PathEscape(deviceID))
}

// canonicalMAC is a MAC as xiaozhi.NormalizeDeviceID writes it.
var canonicalMAC = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)

func (s *Service) store(deviceID, clientID, question, ctype string, photo []byte) (*Photo, error) {
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	now := s.cfg.Now().UTC()
	sum := sha256.Sum256(photo)
	p := &Photo{
		ID: now.Format(photoIDTime) + "-" + hex.EncodeToString(rnd[:]), DeviceID: deviceID, ClientID: clientID,
		Question: question, ContentType: ctype, Size: int64(len(photo)), SHA256: hex.EncodeToString(sum[:]), TakenAt: now,
	}
	dir := s.deviceDir(deviceID)
	s.hold(filepath.Base(dir), p.ID) // released by upload
	ok := false
	defer func() {
		if !ok {
			s.release(filepath.Base(dir), p.ID)
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("photo directory: %w", err)
	}
	image := filepath.Join(dir, p.ID+exts[ctype])
	if err := os.WriteFile(image, photo, 0o600); err != nil {
		_ = os.Remove(image)
		return nil, fmt.Errorf("write photo: %w", err)
	}
	n, err := s.writeMeta(p)
	if err != nil {
		_ = os.Remove(image) // a photo without metadata is listed nowhere
		return nil, err
	}
	s.added(filepath.Base(dir), p.ID, exts[ctype], now, p.Size+n)
	ok = true
	return p, nil
}

// writeMeta writes p's metadata and returns its size.
func (s *Service) writeMeta(p *Photo) (int64, error) {
	b, _ := json.MarshalIndent(p, "", "  ")
	if err := os.WriteFile(filepath.Join(s.deviceDir(p.DeviceID), p.ID+".json"), b, 0o600); err != nil {
		return 0, fmt.Errorf("write photo metadata: %w", err)
	}
	return int64(len(b)), nil
}

// saveMeta records the explanation; the photo is stored already, so a
// failure here is logged, not returned.
func (s *Service) saveMeta(p *Photo) {
	n, err := s.writeMeta(p)
	if err != nil {
		s.log.Warn("vision: could not update photo metadata", "photo", p.ID, "error", err)
		return
	}
	s.added(filepath.Base(s.deviceDir(p.DeviceID)), p.ID, exts[p.ContentType], p.TakenAt, p.Size+n)
}

// explain asks the model about the photo.
func (s *Service) explain(ctx context.Context, question, ctype string, photo []byte) (string, error) {
	m := s.cfg.Model
	if question == "" {
		question = "Describe what is in this photo."
	}
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()
	type imageURL struct {
		URL string `json:"url"`
	}
	type content struct {
		Type     string    `json:"type"`
		Text     string    `json:"text,omitempty"`
		ImageURL *imageURL `json:"image_url,omitempty"`
	}
	body, err := json.Marshal(map[string]any{
		"model": m.Name,
		"messages": []map[string]any{{"role": "user", "content": []content{
			{Type: "text", Text: question},
			{Type: "image_url", ImageURL: &imageURL{URL: "data:" + ctype + ";base64," + base64.StdEncoding.EncodeToString(photo)}},
		}}},
	})
	if err != nil {
		return "", fmt.Errorf("encode model request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.endpoint, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("model request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if m.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+m.APIKey)
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return "", fmt.Errorf("model unreachable: %w", redact.ErrIn(redact.Err(err), m.endpoint))
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("read model reply: %w", err)
	}
	// A provider may echo the key in its message, which reaches the
	// device, the metadata and the log.
	hide := func(msg string) string { return redact.Secret(msg, m.APIKey) }
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("model answered HTTP %d: %s", resp.StatusCode, hide(llmerr.Message(b, resp.Status)))
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return "", fmt.Errorf("model reply is not JSON: %s", hide(llmerr.Truncate(string(b), 200)))
	}
	if len(out.Error) > 0 && string(out.Error) != "null" {
		return "", fmt.Errorf("model answered an error: %s", hide(llmerr.Message(b, "error without a message")))
	}
	if len(out.Choices) == 0 {
		return "", errors.New("model reply has no choices[0].message.content")
	}
	text := strings.TrimSpace(out.Choices[0].Message.Content)
	if text == "" {
		return "", errors.New("model reply is empty")
	}
	return text, nil
}

// Register mounts the REST photo routes on mux, each wrapped by wrap (the
// REST guard).
func (s *Service) Register(mux *http.ServeMux, wrap func(http.Handler) http.Handler) {
	mux.Handle("GET /api/v1/devices/{id}/photos", wrap(http.HandlerFunc(s.list)))
	mux.Handle("GET /api/v1/devices/{id}/photos/{photo}", wrap(http.HandlerFunc(s.get)))
}

// PhotoList is the body of GET /api/v1/devices/{id}/photos.
type PhotoList struct {
	Photos []Photo `json:"photos"`
}

func (s *Service) list(w http.ResponseWriter, r *http.Request) {
	id, ok := s.resolve(w, r)
	if !ok {
		return
	}
	list := PhotoList{Photos: []Photo{}}
	entries, err := os.ReadDir(s.deviceDir(id))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		writeError(w, http.StatusInternalServerError, "internal", "could not list photos")
		s.log.Error("vision: list photos", "device_id", id, "error", err)
		return
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !photoID.MatchString(name) {
			continue
		}
		if p, err := s.meta(id, name); err == nil {
			list.Photos = append(list.Photos, *p)
		}
	}
	// Newest first. By time, not id: an id has whole seconds, then random
	// hex.
	slices.SortFunc(list.Photos, func(a, b Photo) int {
		return cmp.Or(b.TakenAt.Compare(a.TakenAt), strings.Compare(b.ID, a.ID))
	})
	writeJSON(w, http.StatusOK, list)
}

func (s *Service) meta(deviceID, id string) (*Photo, error) {
	b, err := os.ReadFile(filepath.Join(s.deviceDir(deviceID), id+".json"))
	if err != nil {
		return nil, err
	}
	var p Photo
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

func (s *Service) get(w http.ResponseWriter, r *http.Request) {
	id, ok := s.resolve(w, r)
	if !ok {
		return
	}
	pid := r.PathValue("photo")
	if !photoID.MatchString(pid) {
		writeError(w, http.StatusNotFound, "photo_not_found", fmt.Sprintf("no photo %q", pid))
		return
	}
	p, err := s.meta(id, pid)
	if err != nil {
		writeError(w, http.StatusNotFound, "photo_not_found", fmt.Sprintf("no photo %q", pid))
		return
	}
	f, err := os.Open(filepath.Join(s.deviceDir(id), pid+exts[p.ContentType]))
	if err != nil {
		writeError(w, http.StatusNotFound, "photo_not_found", fmt.Sprintf("no photo %q", pid))
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", p.ContentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.ServeContent(w, r, "", p.TakenAt, f)
}

func (s *Service) resolve(w http.ResponseWriter, r *http.Request) (string, bool) {
	id, err := s.cfg.Resolve(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusNotFound, "device_not_found", err.Error())
		return "", false
	}
	return id, true
}

// writeJSON and writeError follow the REST API's conventions (docs/api.md).
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	type info struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	writeJSON(w, status, struct {
		Error info `json:"error"`
	}{info{code, msg}})
}
