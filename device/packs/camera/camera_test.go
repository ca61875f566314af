package camera_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/device/packs/camera"
)

// fakeTools installs capture scripts: ffmpeg and fswebcam write "JPEG" to
// their last argument; broken fails like a missing camera.
func fakeTools(t *testing.T, script string, names ...string) func(string) (string, error) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return func(name string) (string, error) {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", exec.ErrNotFound
		}
		return p, nil
	}
}

const writePhoto = `for last; do :; done; printf 'JPEG' > "$last"`

func takePhoto(t *testing.T, cfg camera.Config) (string, bool) {
	t.Helper()
	pack, err := camera.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := device.NewServer(device.ServerOptions{Profile: device.ProfileSpec})
	if err := srv.AddTool(pack.Tools()[0]); err != nil {
		t.Fatal(err)
	}
	reply := srv.Handle(t.Context(), []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"self.camera.take_photo","arguments":{"question":"what is it?"}}}`))
	var r struct {
		Result struct {
			Content []struct{ Text string } `json:"content"`
			IsError bool                    `json:"isError"`
		} `json:"result"`
	}
	if err := json.Unmarshal(reply, &r); err != nil || len(r.Result.Content) != 1 {
		t.Fatalf("reply %s", reply)
	}
	return r.Result.Content[0].Text, r.Result.IsError
}

func TestTakePhotoUploads(t *testing.T) {
	t.Parallel()
	for _, tool := range camera.Capturers {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			vision := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("Authorization") != "Bearer vt" || r.Header.Get("Device-Id") != "02:00:00:00:00:01" {
					http.Error(w, "bad headers", http.StatusUnauthorized)
					return
				}
				f, _, err := r.FormFile("file")
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				photo, _ := io.ReadAll(f)
				io.WriteString(w, `{"success":true,"text":"`+string(photo)+` for `+r.FormValue("question")+`"}`)
			}))
			t.Cleanup(vision.Close)
			text, isErr := takePhoto(t, camera.Config{
				Vision:   func() device.Vision { return device.Vision{URL: vision.URL, Token: "vt"} },
				DeviceID: "02:00:00:00:00:01", Capture: tool, LookPath: fakeTools(t, writePhoto, tool),
			})
			if isErr || text != `{"success":true,"text":"JPEG for what is it?"}` {
				t.Fatalf("take_photo = %q, %v", text, isErr)
			}
		})
	}
}

func TestTakePhotoFailures(t *testing.T) {
	t.Parallel()
	withVision := func() device.Vision { return device.Vision{URL: "http://127.0.0.1:1/"} }
	tests := []struct {
		name string
		cfg  camera.Config
		want string
	}{
		{"no vision", camera.Config{Vision: func() device.Vision { return device.Vision{} }},
			"the MCP client sent no vision URL in initialize (capabilities.vision, which a XiaoZhi gateway sends; " +
				"MCP hosts over stdio or an endpoint do not), so there is nowhere to send the photo"},
		{"no capture tool", camera.Config{Vision: withVision, LookPath: fakeTools(t, "")}, camera.ErrNoCapture.Error()},
		{"capture fails", camera.Config{Vision: withVision, Device: "/dev/video7",
			LookPath: fakeTools(t, `echo "/dev/video7: No such file or directory" >&2; exit 1`, "fswebcam")},
			"fswebcam could not capture from /dev/video7: /dev/video7: No such file or directory"},
		{"vision unreachable", camera.Config{Vision: withVision, LookPath: fakeTools(t, writePhoto, "ffmpeg")}, "upload the photo: Post"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text, isErr := takePhoto(t, tt.cfg)
			if !isErr || len(text) < len(tt.want) || text[:len(tt.want)] != tt.want {
				t.Fatalf("take_photo = %q, %v; want error starting %q", text, isErr, tt.want)
			}
		})
	}
}

// TestExpiredVisionToken: a refused token asks for a reconnect (a fresh
// token comes with the next initialize) and says so.
func TestExpiredVisionToken(t *testing.T) {
	t.Parallel()
	vision := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "vision token refused: token expired", http.StatusUnauthorized)
	}))
	t.Cleanup(vision.Close)
	refused := 0
	text, isErr := takePhoto(t, camera.Config{
		Vision:   func() device.Vision { return device.Vision{URL: vision.URL, Token: "old"} },
		LookPath: fakeTools(t, writePhoto, "ffmpeg"), OnTokenRefused: func() { refused++ },
	})
	if !isErr || refused != 1 || !strings.Contains(text, "token expired") ||
		!strings.HasSuffix(text, "reconnecting to get a fresh vision token; try again") {
		t.Fatalf("take_photo = %q, %v, reconnects asked %d", text, isErr, refused)
	}
}

// TestCaptureChildHoldingThePipe: a capture tool that exits but leaves a
// child holding its output does not keep the call waiting for the child.
func TestCaptureChildHoldingThePipe(t *testing.T) {
	t.Parallel()
	vision := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(vision.Close)
	start := time.Now()
	text, isErr := takePhoto(t, camera.Config{
		Vision:   func() device.Vision { return device.Vision{URL: vision.URL} },
		LookPath: fakeTools(t, writePhoto+"; sleep 30 &", "ffmpeg"),
	})
	if isErr || text != "ok" || time.Since(start) > 10*time.Second {
		t.Fatalf("take_photo = %q, %v after %s", text, isErr, time.Since(start))
	}
}
