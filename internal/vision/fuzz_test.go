package vision

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
)

// FuzzUpload posts an arbitrary body under an arbitrary Content-Type
// (multipart boundaries, parts and headers included) from an authorised
// device: the endpoint refuses what it cannot use with a 4xx, never a 5xx
// (no model is configured, so a usable photo is stored and answered 200),
// and never panics.
func FuzzUpload(f *testing.F) {
	jpeg := append([]byte{0xff, 0xd8, 0xff, 0xe0}, bytes.Repeat([]byte{1}, 64)...)
	mp := func(boundary, parts string) []byte { return []byte(parts + "--" + boundary + "--\r\n") }
	part := func(boundary, name, filename, ctype string, body []byte) string {
		h := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + name + "\""
		if filename != "" {
			h += "; filename=\"" + filename + "\""
		}
		if ctype != "" {
			h += "\r\nContent-Type: " + ctype
		}
		return h + "\r\n\r\n" + string(body) + "\r\n"
	}
	f.Add("multipart/form-data; boundary=XB", mp("XB", part("XB", "question", "", "", []byte("what is this?"))+part("XB", "file", "camera.jpg", "image/jpeg", jpeg)))
	f.Add("multipart/form-data; boundary=XB", mp("XB", part("XB", "file", "camera.jpg", "image/jpeg", []byte("not a jpeg"))))
	f.Add("multipart/form-data; boundary=XB", mp("XB", ""))
	f.Add("multipart/form-data; boundary=XB", []byte("--XB\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n"))
	f.Add("multipart/form-data", mp("XB", part("XB", "file", "a", "", jpeg)))
	f.Add("image/jpeg", jpeg)
	f.Add("application/json", []byte(`{"file":"x"}`))
	f.Add("multipart/form-data; boundary=\"\"", []byte("--\r\n"))
	auth, err := devauth.New(devauth.Config{Secret: bytes.Repeat([]byte("k"), 32)})
	if err != nil {
		f.Fatal(err)
	}
	svc, err := New(Config{Dir: f.TempDir(), MaxBytes: 4 << 10,
		Verify: func(d, _, tok string) error { return auth.VerifyVision(d, tok) }})
	if err != nil {
		f.Fatal(err)
	}
	tok, err := auth.IssueVision("02:00:00:00:00:01", time.Hour)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ctype string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8000"+Path, bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Device-Id", "02:00:00:00:00:01")
		req.Header.Set("Authorization", "Bearer "+tok)
		rec := httptest.NewRecorder()
		svc.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("status %d for %q %q: %s", rec.Code, ctype, body, rec.Body)
		}
	})
}
