// Package camera is the camera tool pack of mcpgate-device: the firmware's
// self.camera.take_photo. It captures one frame from a V4L2 camera through
// ffmpeg or fswebcam, uploads it to the vision URL and token the gateway
// announced in initialize (capabilities.vision), as firmware does, and
// returns the explanation.
//
//	pack, err := camera.New(camera.Config{Vision: srv.Vision, DeviceID: id})
//	for _, t := range pack.Tools() { _ = srv.AddTool(t) }
package camera

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

// Capturers, in the order they are tried.
var Capturers = []string{"ffmpeg", "fswebcam"}

// Config configures a [Pack].
type Config struct {
	// Vision returns the upload target; required. Pass the device
	// Server's Vision method.
	Vision func() device.Vision
	// Device is the V4L2 device; "" means /dev/video0.
	Device string
	// Capture is "ffmpeg" or "fswebcam"; "" picks the first installed.
	Capture string
	// Resolution is the frame size asked for; "" means 640x480.
	Resolution string
	// DeviceID and ClientID are sent as the Device-Id and Client-Id
	// headers of the upload, as firmware sends them.
	DeviceID, ClientID string
	// HTTPClient uploads; nil means one with a 30 s timeout.
	HTTPClient *http.Client
	// LookPath finds a command; nil means exec.LookPath.
	LookPath func(string) (string, error)
	// OnTokenRefused, if set, is called when the vision service refuses
	// the token (HTTP 401 or 403: it expired, by default after an hour).
	// Pass the device Server's Reconnect: the gateway hands a fresh token
	// in the next initialize.
	OnTokenRefused func()
}

// Pack is the camera tool pack. It is safe for concurrent use.
type Pack struct {
	cfg Config
}

// New returns the pack.
func New(cfg Config) (*Pack, error) {
	if cfg.Vision == nil {
		return nil, errors.New("camera: Config.Vision is required")
	}
	if cfg.Device == "" {
		cfg.Device = "/dev/video0"
	}
	if cfg.Capture != "" && !slices.Contains(Capturers, cfg.Capture) {
		return nil, fmt.Errorf("camera: unknown capture tool %q (want ffmpeg or fswebcam)", cfg.Capture)
	}
	if cfg.Resolution == "" {
		cfg.Resolution = "640x480"
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.LookPath == nil {
		cfg.LookPath = exec.LookPath
	}
	return &Pack{cfg: cfg}, nil
}

const descTakePhoto = "Take a photo and explain it. Use this tool after the user asks you to see something.\n" +
	"Args:\n" +
	"  `question`: The question that you want to ask about the photo.\n" +
	"Return:\n" +
	"  A JSON object that provides the photo information."

// Tools returns the pack's tools.
func (p *Pack) Tools() []device.Tool {
	return []device.Tool{{
		Name:        "self.camera.take_photo",
		Description: descTakePhoto,
		Properties:  []device.Property{device.Str("question")},
		Handler:     p.takePhoto,
	}}
}

// ErrNoCapture is returned when neither ffmpeg nor fswebcam is installed.
var ErrNoCapture = errors.New("no capture tool found: install ffmpeg or fswebcam")

func (p *Pack) takePhoto(ctx context.Context, a device.Args) (any, error) {
	v := p.cfg.Vision()
	if v.URL == "" {
		return nil, errors.New("the MCP client sent no vision URL in initialize (capabilities.vision, which a XiaoZhi gateway sends; " +
			"MCP hosts over stdio or an endpoint do not), so there is nowhere to send the photo")
	}
	photo, err := p.capture(ctx)
	if err != nil {
		return nil, err
	}
	return p.upload(ctx, v, photo, a.String("question"))
}

// capture takes one JPEG frame.
func (p *Pack) capture(ctx context.Context) ([]byte, error) {
	names := Capturers
	if p.cfg.Capture != "" {
		names = []string{p.cfg.Capture}
	}
	var name, path string
	for _, n := range names {
		if lp, err := p.cfg.LookPath(n); err == nil {
			name, path = n, lp
			break
		}
	}
	if path == "" {
		if p.cfg.Capture != "" {
			return nil, fmt.Errorf("capture tool %q is configured but not installed", p.cfg.Capture)
		}
		return nil, ErrNoCapture
	}
	dir, err := os.MkdirTemp("", "mcpgate-photo-")
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "photo.jpg")
	var args []string
	switch name {
	case "ffmpeg":
		args = []string{"-hide_banner", "-loglevel", "error", "-f", "v4l2", "-video_size", p.cfg.Resolution,
			"-i", p.cfg.Device, "-frames:v", "1", "-q:v", "3", "-y", out}
	case "fswebcam":
		args = []string{"-q", "-d", p.cfg.Device, "-r", p.cfg.Resolution, "--no-banner", "--jpeg", "85", out}
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	// A child the tool left holding the output pipe must not keep the call
	// past its timeout; the photo is complete once the tool exited.
	cmd.WaitDelay = time.Second
	msg, err := cmd.CombinedOutput()
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		text := strings.TrimSpace(string(msg))
		if text == "" {
			text = err.Error()
		}
		return nil, fmt.Errorf("%s could not capture from %s: %s", name, p.cfg.Device, text)
	}
	photo, err := os.ReadFile(out)
	if err != nil || len(photo) == 0 {
		return nil, fmt.Errorf("%s wrote no photo from %s: %s", name, p.cfg.Device, strings.TrimSpace(string(msg)))
	}
	return photo, nil
}

// upload posts the photo as firmware does: multipart with a "question"
// field and a "file" part, the token as a Bearer, and returns the answer.
func (p *Pack) upload(ctx context.Context, v device.Vision, photo []byte, question string) (string, error) {
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	_ = w.WriteField("question", question) // writes to a bytes.Buffer cannot fail
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="camera.jpg"`)
	h.Set("Content-Type", "image/jpeg")
	part, _ := w.CreatePart(h)
	_, _ = part.Write(photo)
	_ = w.Close()

	req, err := http.NewRequestWithContext(ctx, http.MethodPost, v.URL, &body)
	if err != nil {
		return "", fmt.Errorf("vision URL %q: %w", v.URL, err)
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	if p.cfg.DeviceID != "" {
		req.Header.Set("Device-Id", p.cfg.DeviceID)
	}
	if p.cfg.ClientID != "" {
		req.Header.Set("Client-Id", p.cfg.ClientID)
	}
	if v.Token != "" {
		req.Header.Set("Authorization", "Bearer "+v.Token)
	}
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("upload the photo: %w", err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("read the vision answer: %w", err)
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		if p.cfg.OnTokenRefused != nil {
			p.cfg.OnTokenRefused()
			return "", fmt.Errorf("the vision service refused the token (%s: %s); reconnecting to get a fresh vision token; try again",
				resp.Status, strings.TrimSpace(string(answer)))
		}
		return "", fmt.Errorf("the vision service refused the token (%s: %s); the gateway hands a fresh one when the device reconnects",
			resp.Status, strings.TrimSpace(string(answer)))
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("the vision service answered %s: %s", resp.Status, strings.TrimSpace(string(answer)))
	}
	return string(answer), nil
}
