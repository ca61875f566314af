package vision_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// visionCase is one attack on /vision/explain. Uploads carry a valid
// vision token unless the case is about tokens: a device's own camera, or
// anyone who got hold of a token, is the attacker. Every case asserts the
// answers, a log line and a metric, bounded memory, and that a healthy
// device's calls made throughout all succeed promptly.
type visionCase struct {
	name   string
	attack func(t *testing.T, v *visionTarget)
	log    []string
	metric string
	delta  float64
}

const (
	visionLatency = 2 * time.Second
	visionHeap    = 16 << 20
	visionHealthy = "02:00:00:06:aa:01"
	visionDevice  = "02:00:00:06:bb:01"
	visionMax     = 256 << 10 // the gateway's --vision-max-bytes here
)

type visionTarget struct {
	addr  string
	token string // a valid vision token of visionDevice
}

func TestHostileUploads(t *testing.T) {
	secret := bytes.Repeat([]byte("s"), 32)
	tests := []visionCase{{
		name:   "wrong content types",
		attack: attackContentTypes,
		log:    []string{"vision: upload refused", "reason=not_multipart"},
		metric: `mcpgate_bad_requests_total{door="vision",reason="not_multipart"}`, delta: 80,
	}, {
		name:   "truncated multipart",
		attack: attackTruncated,
		log:    []string{"vision: upload refused", "reason=malformed_multipart"},
		metric: `mcpgate_bad_requests_total{door="vision",reason="malformed_multipart"}`, delta: 20,
	}, {
		name:   "multipart bomb: thousands of parts",
		attack: attackManyParts,
		log:    []string{"vision: upload refused", "reason=no_file"},
		metric: `mcpgate_bad_requests_total{door="vision",reason="no_file"}`, delta: 5,
	}, {
		name:   "huge image",
		attack: attackHugeImage,
		log:    []string{"vision: upload refused: photo over the limit"},
		metric: `mcpgate_limit_hits_total{limit="vision_body"}`, delta: 10,
	}, {
		name:   "part with a 1 MiB header",
		attack: attackHugePartHeader,
		log:    []string{"vision: upload refused: photo over the limit", "limit=vision_body"},
		metric: `mcpgate_limit_hits_total{limit="vision_body"}`, delta: 5,
	}, {
		name:   "invalid UTF-8",
		attack: attackInvalidUTF8,
		log:    []string{"vision: upload refused", "reason=not_multipart"},
		metric: `mcpgate_bad_requests_total{door="vision",reason="not_multipart"}`, delta: 20,
	}, {
		name:   "upload a byte at a time",
		attack: attackSlowUpload,
		log:    []string{"request body did not arrive in time", "limit=http_body_timeout", "path=/vision/explain"},
		metric: `mcpgate_limit_hits_total{limit="http_body_timeout"}`, delta: 1,
	}, {
		name:   "not an image",
		attack: attackNotImage,
		log:    []string{"vision: upload refused", "reason=not_an_image"},
		metric: `mcpgate_bad_requests_total{door="vision",reason="not_an_image"}`, delta: 20,
	}, {
		name:   "bad tokens",
		attack: attackBadTokens,
		log:    []string{"device authentication failed", "transport=vision"},
		metric: `mcpgate_device_auth_failures_total{reason="bad_signature",transport="vision"}`, delta: 20,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A gateway per case: refusals are logged at most once per 10 s
			// per reason, so a case sharing a gateway with an earlier one
			// could find its line suppressed.
			logs := &hostiletest.Logs{}
			gw, _ := gatewaytest.Start(t, gateway.Config{Logger: logs.Logger(),
				Provisioning: gateway.Provisioning{DeviceSecret: secret, VisionMaxBytes: visionMax, VisionUploadRate: -1},
				Limits:       gateway.Limits{DeviceCallRate: -1, KeyCallRate: -1, DeviceMaxInFlight: -1, ReadBodyTimeout: 500 * time.Millisecond}})
			authority, err := devauth.New(devauth.Config{Secret: secret})
			if err != nil {
				t.Fatal(err)
			}
			tok, err := authority.IssueVision(visionDevice, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			v := &visionTarget{addr: gw.Addr(), token: tok}
			gatewaytest.ConnectReady(t, gw, devicetest.Config{ID: visionHealthy})

			heap := hostiletest.HeapInuse()
			m0 := hostiletest.Metric(t, v.addr, tt.metric)
			off := logs.Len()
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("gateway logs during the attack:\n%s", logs.Since(off, 8000))
				}
			})
			healthy := hostiletest.StartHealthy(func(ctx context.Context) error {
				res, err := gw.Hub().Call(ctx, hub.CallRequest{Device: visionHealthy, Tool: "self.audio_speaker.set_volume", Arguments: json.RawMessage(`{"volume":5}`)})
				if err == nil && res.Text() != "true" {
					err = fmt.Errorf("unexpected result %+v", res)
				}
				return err
			}, 2*time.Millisecond)
			tt.attack(t, v)
			if tt.log != nil {
				logs.WaitLine(t, off, tt.log...)
			}
			hostiletest.WaitMetric(t, v.addr, tt.metric, m0+tt.delta)
			healthy.Stop(t, visionLatency)
			hostiletest.CheckHeap(t, heap, visionHeap)
			// A real photo is still accepted.
			b, ctype := form(t, jpegBytes(1024))
			if status, answer := v.upload(t, ctype, "", b); status != http.StatusOK || !strings.Contains(answer, `"photo"`) {
				t.Errorf("a photo after the attack: %d %.200s", status, answer)
			}
		})
	}
}

// upload posts body as visionDevice with its token (or tok when set).
func (v *visionTarget) upload(t *testing.T, ctype, tok string, body io.Reader) (int, string) {
	t.Helper()
	if tok == "" {
		tok = v.token
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+v.addr+"/vision/explain", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Device-Id", visionDevice)
	req.Header.Set("Client-Id", "00000000-0000-4000-8000-020000060001")
	req.Header.Set("Authorization", "Bearer "+tok)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error() // the gateway refused and closed while the client still wrote
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// jpegBytes is n bytes starting with JPEG's magic: enough for the sniffer.
func jpegBytes(n int) []byte {
	b := bytes.Repeat([]byte{0x42}, n)
	copy(b, []byte{0xFF, 0xD8, 0xFF, 0xE0})
	return b
}

func form(t *testing.T, file []byte) (*bytes.Buffer, string) {
	t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	if err := w.WriteField("question", "what is this?"); err != nil {
		t.Fatal(err)
	}
	p, err := w.CreateFormFile("file", "camera.jpg")
	if err != nil {
		t.Fatal(err)
	}
	p.Write(file)
	w.Close()
	return &b, w.FormDataContentType()
}

func want(t *testing.T, what string, status int, answer string, wantStatus int) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("%s: %d %.200s, want %d", what, status, answer, wantStatus)
	}
}

func attackContentTypes(t *testing.T, v *visionTarget) {
	for range 20 {
		for _, ct := range []string{"", "image/jpeg", "application/json", "multipart/form-data"} {
			status, answer := v.upload(t, ct, "", bytes.NewReader(jpegBytes(512)))
			want(t, fmt.Sprintf("content type %q", ct), status, answer, http.StatusBadRequest)
		}
	}
}

func attackTruncated(t *testing.T, v *visionTarget) {
	b, ctype := form(t, jpegBytes(4096))
	cut := b.Bytes()[:b.Len()-200] // inside the file part, before the closing boundary
	for range 20 {
		status, answer := v.upload(t, ctype, "", bytes.NewReader(cut))
		want(t, "truncated multipart", status, answer, http.StatusBadRequest)
	}
}

// attackManyParts sends forms of as many tiny parts as fit in the size
// limit (about 2,800 here, 45,000 at the default 5 MB), and no file: each
// part is read and discarded as it comes, so the bomb costs the time to
// parse it and no memory.
func attackManyParts(t *testing.T, v *visionTarget) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for i := 0; b.Len() < visionMax; i++ {
		w.WriteField(fmt.Sprintf("f%d", i%10), "x")
	}
	w.Close()
	for range 5 {
		status, answer := v.upload(t, w.FormDataContentType(), "", bytes.NewReader(b.Bytes()))
		want(t, "40,000 parts", status, answer, http.StatusBadRequest)
	}
}

func attackHugePartHeader(t *testing.T, v *visionTarget) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="`+strings.Repeat("a", 1<<20)+`.jpg"`)
	p, err := w.CreatePart(h)
	if err != nil {
		t.Fatal(err)
	}
	p.Write(jpegBytes(100))
	w.Close()
	for range 5 {
		// Bounded by the body's limit, as everything else in the form.
		if status, answer := v.upload(t, w.FormDataContentType(), "", bytes.NewReader(b.Bytes())); status != 0 {
			want(t, "a 1 MiB part header", status, answer, http.StatusRequestEntityTooLarge)
		}
	}
}

func attackHugeImage(t *testing.T, v *visionTarget) {
	b, ctype := form(t, jpegBytes(8<<20))
	for i := range 10 {
		var body io.Reader = bytes.NewReader(b.Bytes())
		if i%2 == 1 {
			body = io.MultiReader(body) // chunked: no length known up front
		}
		if status, answer := v.upload(t, ctype, "", body); status != 0 {
			want(t, "an 8 MiB image", status, answer, http.StatusRequestEntityTooLarge)
		}
	}
}

// attackInvalidUTF8 sends forms whose boundary holds invalid bytes,
// refused as not multipart, and a photo whose question and file name
// hold them, which is served: they are only ever text.
func attackInvalidUTF8(t *testing.T, v *visionTarget) {
	b, ctype := form(t, jpegBytes(1024))
	bad := strings.Replace(ctype, "boundary=", "boundary=\xff\xfe", 1)
	for range 20 {
		status, answer := v.upload(t, bad, "", bytes.NewReader(b.Bytes()))
		want(t, "a boundary with invalid bytes", status, answer, http.StatusBadRequest)
	}
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	if err := w.WriteField("question", "what is \xff\xfe\xc3\x28?"); err != nil {
		t.Fatal(err)
	}
	p, err := w.CreateFormFile("file", "\xed\xa0\x80.jpg")
	if err != nil {
		t.Fatal(err)
	}
	p.Write(jpegBytes(1024))
	w.Close()
	status, answer := v.upload(t, w.FormDataContentType(), "", &body)
	want(t, "invalid bytes in the question and file name", status, answer, http.StatusOK)
}

// attackSlowUpload sends an upload's headers at once and its body a byte
// every 100 ms: the gateway refuses it at the body deadline and closes
// the connection.
func attackSlowUpload(t *testing.T, v *visionTarget) {
	b, ctype := form(t, jpegBytes(1024))
	hostiletest.SlowBody(t, v.addr, fmt.Sprintf("POST /vision/explain HTTP/1.1\r\nHost: %s\r\nDevice-Id: %s\r\nClient-Id: 00000000-0000-4000-8000-020000060001\r\n"+
		"Authorization: Bearer %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", v.addr, visionDevice, v.token, ctype, b.Len()), b.Bytes())
}

func attackNotImage(t *testing.T, v *visionTarget) {
	for range 20 {
		b, ctype := form(t, []byte("<html>definitely not a photo</html>"))
		status, answer := v.upload(t, ctype, "", b)
		want(t, "not an image", status, answer, http.StatusUnsupportedMediaType)
	}
}

func attackBadTokens(t *testing.T, v *visionTarget) {
	for i := range 20 {
		b, ctype := form(t, jpegBytes(1024))
		// A well-formed token of another key: its signature fails. One
		// character inside the signature changes, to another base64url
		// one: the last character also carries padding bits, and changing
		// it can make the token malformed instead.
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
		at := len(v.token) - 8
		c := alphabet[(strings.IndexByte(alphabet, v.token[at])+1+i)%len(alphabet)]
		forged := v.token[:at] + string(c) + v.token[at+1:]
		status, answer := v.upload(t, ctype, forged, b)
		want(t, "a forged token", status, answer, http.StatusUnauthorized)
	}
}
