package ws

import (
	"net/http/httptest"
	"strings"
	"testing"
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
		// Allowed until the first message: the registration dialect names
		// the device in mac_addr (register_test.go checks a hello is refused).
		name:   "no device id",
		target: "/xiaozhi/v1/?client-id=c",
		want:   identity{clientID: "c"},
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
