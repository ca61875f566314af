package ws

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// The identity parts the hub never shows, the token above all, are checked
// here; ws_test.go checks the rest through a real gateway.
func TestIdentify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		target  string
		header  map[string]string
		want    identity
		wantErr string
	}{{
		name:   "firmware headers",
		target: "/xiaozhi/v1/",
		header: map[string]string{"Device-Id": "AA:BB:CC:DD:EE:FF", "Client-Id": "c-1", "Protocol-Version": "1", "Authorization": "Bearer tok"},
		want:   identity{deviceID: "aa:bb:cc:dd:ee:ff", clientID: "c-1", token: "tok", protoVer: "1"},
	}, {
		name:   "browser query",
		target: "/xiaozhi/v1/?device-id=aa-bb-cc-dd-ee-ff&client-id=c-2&protocol-version=3&authorization=Bearer%20q-tok",
		want:   identity{deviceID: "aa:bb:cc:dd:ee:ff", clientID: "c-2", token: "q-tok", protoVer: "3"},
	}, {
		name:   "scheme in any case, spaces trimmed",
		target: "/xiaozhi/v1/",
		header: map[string]string{"Device-Id": " dev-1 ", "Authorization": "bearer   spaced "},
		want:   identity{deviceID: "dev-1", token: "spaced"},
	}, {
		name:   "token with a space kept as is",
		target: "/xiaozhi/v1/",
		header: map[string]string{"Device-Id": "dev-1", "Authorization": "abc def"},
		want:   identity{deviceID: "dev-1", token: "abc def"},
	}, {
		name:   "bare token",
		target: "/xiaozhi/v1/?authorization=raw",
		header: map[string]string{"Device-Id": "dev-1"},
		want:   identity{deviceID: "dev-1", token: "raw"},
	}, {
		name:   "header wins over query",
		target: "/xiaozhi/v1/?device-id=dev-q&authorization=Bearer%20q",
		header: map[string]string{"Device-Id": "dev-h", "Authorization": "Bearer h"},
		want:   identity{deviceID: "dev-h", token: "h"},
	}, {
		name:    "no device id",
		target:  "/xiaozhi/v1/?client-id=c",
		wantErr: "Device-Id",
	}, {
		name:    "bad device id",
		target:  "/xiaozhi/v1/",
		header:  map[string]string{"Device-Id": "a#b"},
		wantErr: "invalid device id",
	}, {
		name:    "protocol version not a number",
		target:  "/xiaozhi/v1/",
		header:  map[string]string{"Device-Id": "dev-1", "Protocol-Version": "v1"},
		wantErr: "Protocol-Version",
	}, {
		name:    "protocol version zero",
		target:  "/xiaozhi/v1/?protocol-version=0",
		header:  map[string]string{"Device-Id": "dev-1"},
		wantErr: "Protocol-Version",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("GET", tt.target, nil)
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			got, err := identify(r)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("identify: %v, want an error mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("identify = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestCloseReason(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in string
	}{
		{"short", "gateway shutting down"},
		{"exactly 123 bytes", strings.Repeat("a", 123)},
		{"124 bytes", strings.Repeat("a", 124)},
		{"long ASCII", strings.Repeat("a", 500)},
		{"CJK cut at 0 mod 3", strings.Repeat("好", 60)},
		{"CJK cut at 1 mod 3", "a" + strings.Repeat("好", 60)},
		{"CJK cut at 2 mod 3", "ab" + strings.Repeat("好", 60)},
		{"4-byte runes", "abc" + strings.Repeat("😀", 40)},
		{"invalid UTF-8", "bad \xff\xfe byte"},
		{"long invalid UTF-8", strings.Repeat("\xff", 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := closeReason(errors.New(tt.in))
			if len(got) > maxCloseReason || !utf8.ValidString(got) {
				t.Fatalf("closeReason = %q (%d bytes), want valid UTF-8 of at most %d bytes", got, len(got), maxCloseReason)
			}
			if utf8.ValidString(tt.in) && len(tt.in) <= maxCloseReason && got != tt.in {
				t.Errorf("closeReason = %q, want %q unchanged", got, tt.in)
			}
			if utf8.ValidString(tt.in) && len(tt.in) > maxCloseReason && !strings.HasSuffix(got, "…") {
				t.Errorf("closeReason = %q, want a cut marked with …", got)
			}
			if stem := strings.TrimSuffix(got, "…"); utf8.ValidString(tt.in) && !strings.HasPrefix(tt.in, stem) {
				t.Errorf("closeReason = %q is not a prefix of the error", got)
			}
		})
	}
}
