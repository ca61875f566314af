package vision

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/jpeg"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

const dev = "02:00:00:00:00:01"

func photo(t testing.TB) []byte {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, image.NewGray(image.Rect(0, 0, 8, 8)), nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func form(t testing.TB, question string, file []byte) (*bytes.Buffer, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	w.WriteField("question", question)
	p, _ := w.CreateFormFile("file", "camera.jpg")
	p.Write(file)
	w.Close()
	return &b, w.FormDataContentType()
}

type fixture struct {
	srv  *httptest.Server
	svc  *Service
	auth *devauth.Authority
	dir  string
}

func newFixture(t *testing.T, model *Model, maxBytes int64) *fixture {
	t.Helper()
	return newFixtureWith(t, Config{Model: model, MaxBytes: maxBytes})
}

// newFixtureWith serves a Service of cfg on a random loopback port: Dir
// defaults to a temporary directory, Verify to vision tokens of the
// fixture's authority, UploadRate to no limit.
func newFixtureWith(t *testing.T, cfg Config) *fixture {
	t.Helper()
	auth, err := devauth.New(devauth.Config{Secret: bytes.Repeat([]byte("k"), 32)})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	dir := cfg.Dir
	cfg.Verify = func(d, _, tok string) error { return auth.VerifyVision(d, tok) }
	if cfg.UploadRate.PerSecond == 0 {
		cfg.UploadRate.PerSecond = -1
	}
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, svc)
	svc.Register(mux, func(h http.Handler) http.Handler { return h })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &fixture{srv: srv, svc: svc, auth: auth, dir: dir}
}

func (f *fixture) post(t *testing.T, device, token string, body io.Reader, ctype string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+Path, body)
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Device-Id", device)
	req.Header.Set("Client-Id", "c-1")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestUploadRefusals(t *testing.T) {
	f := newFixture(t, nil, 1024)
	tok, _ := f.auth.IssueVision(dev, time.Hour)
	devTok, _ := f.auth.IssueDevice(dev, "", time.Hour)
	jpg := photo(t)
	tests := []struct {
		name, device, token string
		file                []byte
		status              int
	}{
		{"ok", dev, tok, jpg, 200},
		{"no token", dev, "", jpg, 401},
		{"malformed token", dev, "abc", jpg, 401},
		{"device token instead of vision token", dev, devTok, jpg, 401},
		{"wrong device", "02:00:00:00:00:02", tok, jpg, 403},
		{"oversize", dev, tok, append(bytes.Clone(jpg), make([]byte, 2048)...), 413},
		{"not an image", dev, tok, []byte("GIF89a not really"), 415},
		{"png accepted", dev, tok, []byte("\x89PNG\r\n\x1a\nrest"), 200},
		{"webp accepted", dev, tok, []byte("RIFF\x00\x00\x00\x00WEBPVP8 "), 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, ct := form(t, "what?", tt.file)
			status, body := f.post(t, tt.device, tt.token, b, ct)
			if status != tt.status {
				t.Fatalf("status %d, want %d: %s", status, tt.status, body)
			}
		})
	}
	t.Run("not multipart", func(t *testing.T) {
		status, _ := f.post(t, dev, tok, strings.NewReader("{}"), "application/json")
		if status != 400 {
			t.Fatalf("status %d", status)
		}
	})
	t.Run("no Device-Id", func(t *testing.T) {
		b, ct := form(t, "q", jpg)
		status, _ := f.post(t, "", tok, b, ct)
		if status != 400 {
			t.Fatalf("status %d", status)
		}
	})
	t.Run("form over the body bound", func(t *testing.T) {
		// A small photo, a 70 KB question: the body, not the photo, is
		// over its bound.
		b, ct := form(t, strings.Repeat("q", 70_000), jpg)
		status, body := f.post(t, dev, tok, b, ct)
		if want := "request body is over 66560 bytes: the photo's bound 1024 plus 64 KiB"; status != 413 || !strings.Contains(body, want) {
			t.Fatalf("%d %q, want 413 saying %q", status, body, want)
		}
	})
	t.Run("long question cut", func(t *testing.T) {
		b, ct := form(t, strings.Repeat("q", 20_000), jpg)
		if status, body := f.post(t, dev, tok, b, ct); status != 200 {
			t.Fatalf("%d %q", status, body)
		}
		if q := f.photos(t, dev)[0].Question; len(q) != 16<<10 {
			t.Errorf("question of %d bytes stored, want it cut to 16 KiB", len(q))
		}
	})
}

// TestChunkedUploadAndREST uploads with chunked transfer encoding (no
// Content-Length), then lists and fetches the photo over REST.
func TestChunkedUploadAndREST(t *testing.T) {
	f := newFixture(t, nil, 0)
	tok, _ := f.auth.IssueVision(dev, time.Hour)
	jpg := photo(t)
	b, ct := form(t, "what is this?", jpg)
	pr, pw := io.Pipe()
	go func() { // owned: ends when the buffer is copied, before post returns
		_, err := io.Copy(pw, b)
		pw.CloseWithError(err)
	}()
	status, body := f.post(t, dev, tok, pr, ct)
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	var answer struct {
		Photo, URL string
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || answer.Photo == "" {
		t.Fatalf("answer %q: %v", body, err)
	}
	fi, err := os.Stat(filepath.Join(f.dir, "02_00_00_00_00_01", answer.Photo+".jpg"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stored photo: %v, %v", fi, err)
	}
	if di, _ := os.Stat(filepath.Join(f.dir, "02_00_00_00_00_01")); di.Mode().Perm() != 0o700 {
		t.Errorf("photo dir mode %v", di.Mode().Perm())
	}

	if list := f.photos(t, dev); len(list) != 1 || list[0].ID != answer.Photo || list[0].Question != "what is this?" {
		t.Fatalf("list %+v", list)
	}
	resp, err := http.Get(f.srv.URL + answer.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/jpeg" || !bytes.Equal(got, jpg) {
		t.Fatalf("GET photo: %d %s, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(got))
	}
	for _, p := range []string{"/photos/..%2f..%2fsecret", "/photos/20260101T000000Z-00000000"} {
		resp, err = http.Get(f.srv.URL + "/api/v1/devices/" + dev + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
}

// TestModel checks the chat/completions request and that the model's text
// is the answer; a failing model still answers 200 with a relayable text.
func TestModel(t *testing.T) {
	var fail bool
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer key" {
			http.Error(w, "bad request", 400)
			return
		}
		var req struct {
			Model    string
			Messages []struct {
				Content []struct {
					Type     string
					Text     string
					ImageURL struct{ URL string } `json:"image_url"`
				}
			}
		}
		json.NewDecoder(r.Body).Decode(&req)
		if fail {
			http.Error(w, "overloaded", 503)
			return
		}
		c := req.Messages[0].Content
		fmt.Fprintf(w, `{"choices":[{"message":{"role":"assistant","content":%q}}]}`,
			fmt.Sprintf("model %s saw %q with %s", req.Model, c[0].Text, c[1].ImageURL.URL[:23]))
	}))
	defer stub.Close()
	f := newFixture(t, &Model{BaseURL: stub.URL + "/v1", Name: "vis-1", APIKey: "key"}, 0)
	tok, _ := f.auth.IssueVision(dev, time.Hour)
	b, ct := form(t, "what colour?", photo(t))
	status, body := f.post(t, dev, tok, b, ct)
	if want := `model vis-1 saw "what colour?" with data:image/jpeg;base64,`; status != 200 || body != want {
		t.Fatalf("%d %q, want %q", status, body, want)
	}
	fail = true
	b, ct = form(t, "again?", photo(t))
	status, body = f.post(t, dev, tok, b, ct)
	if status != 200 || !strings.Contains(body, "could not explain it: model answered HTTP 503") {
		t.Fatalf("%d %q", status, body)
	}
}

// TestModelFailures: what a failing model says reaches the device and the
// photo's metadata, without the API key a provider echoes.
func TestModelFailures(t *testing.T) {
	const key = "sk-vision-secret-1234567890"
	for _, tc := range []struct {
		name   string
		status int
		reply  string
		want   string
	}{
		{"provider message", 400, `{"error":{"message":"model does not support images"}}`, "model answered HTTP 400: model does not support images"},
		{"key echoed", 401, `{"error":{"message":"Incorrect API key provided: sk-vision-secret-12…"}}`, "model answered HTTP 401: Incorrect API key provided: REDACTED…"},
		{"not JSON", 200, `<html>oops</html>`, "model reply is not JSON: <html>oops</html>"},
		{"error in a 200", 200, `{"error":{"message":"quota exceeded"}}`, "model answered an error: quota exceeded"},
		{"blank answer", 200, `{"choices":[{"message":{"content":"   "}}]}`, "model reply is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.reply)
			}))
			defer stub.Close()
			f := newFixture(t, &Model{BaseURL: stub.URL + "/v1", Name: "vis-1", APIKey: key}, 0)
			tok, _ := f.auth.IssueVision(dev, time.Hour)
			b, ct := form(t, "", photo(t))
			status, body := f.post(t, dev, tok, b, ct)
			if status != 200 || !strings.HasSuffix(body, "could not explain it: "+tc.want) || strings.Contains(body, "secret") {
				t.Fatalf("%d %q, want it to end %q", status, body, tc.want)
			}
			if list := f.photos(t, dev); len(list) != 1 || list[0].ModelError != tc.want || list[0].Explanation != "" {
				t.Fatalf("metadata %+v, want model_error %q", list, tc.want)
			}
		})
	}
}

// TestDeviceDirsDoNotCollide: every device id has a photo directory of its
// own: an id that is no MAC but reads as one with underscores does not share
// a MAC's.
func TestDeviceDirsDoNotCollide(t *testing.T) {
	s := &Service{cfg: Config{Dir: t.TempDir()}}
	seen := map[string]string{}
	for _, id := range []string{"02:00:00:00:03:01", "02_00:00:00:03:01", "02_00_00_00_03_01", "kitchen", "id-kitchen", "a%2Fb", "a/b"} {
		dir := s.deviceDir(id)
		if other, ok := seen[dir]; ok {
			t.Errorf("%q and %q share the photo directory %s", id, other, dir)
		}
		if filepath.Dir(dir) != s.cfg.Dir {
			t.Errorf("%q: directory %s is not directly under %s", id, dir, s.cfg.Dir)
		}
		seen[dir] = id
	}
	if got := filepath.Base(s.deviceDir("02:00:00:00:03:01")); got != "02_00_00_00_03_01" {
		t.Errorf("a MAC's directory: %s, want 02_00_00_00_03_01 (as before)", got)
	}
}

// TestModelBaseURLChecked: a base URL no request can go to is refused at
// New, not at every photo.
func TestModelBaseURLChecked(t *testing.T) {
	verify := func(string, string, string) error { return nil }
	for _, base := range []string{"localhost:45001/v1", "ftp://h/v1", "http:///v1", "://"} {
		_, err := New(Config{Dir: t.TempDir(), Verify: verify, Model: &Model{BaseURL: base, Name: "v"}})
		if err == nil || !strings.Contains(err.Error(), strconv.Quote(base)) {
			t.Errorf("base URL %q: err = %v, want one naming it", base, err)
		}
	}
	if _, err := New(Config{Dir: t.TempDir(), Verify: verify, Model: &Model{BaseURL: "http://localhost:11434/v1", Name: "v"}}); err != nil {
		t.Errorf("a good base URL: %v", err)
	}
}

// TestModelBaseURLWithQuery: chat/completions is joined to the base URL's
// path, its query kept (Azure's ?api-version=), and a request that fails
// names the URL without its query values or password.
func TestModelBaseURLWithQuery(t *testing.T) {
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" || r.URL.RawQuery != "api-version=2024-10-21" {
			http.Error(w, "wrong URL "+r.URL.String(), 404)
			return
		}
		io.WriteString(w, `{"choices":[{"message":{"content":"a cat"}}]}`)
	}))
	defer stub.Close()
	f := newFixture(t, &Model{BaseURL: stub.URL + "/v1/?api-version=2024-10-21", Name: "vis-1"}, 0)
	tok, _ := f.auth.IssueVision(dev, time.Hour)
	b, ct := form(t, "what?", photo(t))
	if status, body := f.post(t, dev, tok, b, ct); status != 200 || body != "a cat" {
		t.Fatalf("%d %q, want the model's answer", status, body)
	}

	gone := "http://user:pw-secret@" + stub.Listener.Addr().String() + "/v1?key=query-secret"
	stub.Close()
	f = newFixture(t, &Model{BaseURL: gone, Name: "vis-1"}, 0)
	tok, _ = f.auth.IssueVision(dev, time.Hour)
	b, ct = form(t, "what?", photo(t))
	status, body := f.post(t, dev, tok, b, ct)
	if status != 200 || !strings.Contains(body, "model unreachable") || strings.Contains(body, "secret") {
		t.Fatalf("%d %q, want model unreachable without the secrets", status, body)
	}
}
