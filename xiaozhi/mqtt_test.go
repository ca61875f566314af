package xiaozhi_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

func TestParseMQTTClientID(t *testing.T) {
	const uuid = "6f1d9e52-0000-4000-8000-000000000001"
	for _, tt := range []struct {
		in   string
		want xiaozhi.MQTTClientID // zero: an error is expected
	}{
		{"GID_test@@@02_00_00_00_00_01@@@" + uuid, xiaozhi.MQTTClientID{Group: "test", DeviceID: "02:00:00:00:00:01", UUID: uuid}},
		{"GID_mcpgate@@@AA_BB_CC_DD_EE_FF@@@u", xiaozhi.MQTTClientID{Group: "mcpgate", DeviceID: "aa:bb:cc:dd:ee:ff", UUID: "u"}},
		{"GID_g@@@aa:bb:cc:dd:ee:ff@@@u", xiaozhi.MQTTClientID{Group: "g", DeviceID: "aa:bb:cc:dd:ee:ff", UUID: "u"}},
		{"GID_g@@@AABBCCDDEEFF@@@u", xiaozhi.MQTTClientID{Group: "g", DeviceID: "aa:bb:cc:dd:ee:ff", UUID: "u"}},
		{"GID_g@@@aa-bb-cc-dd-ee-ff@@@u", xiaozhi.MQTTClientID{Group: "g", DeviceID: "aa:bb:cc:dd:ee:ff", UUID: "u"}},
		{"GID_g@@@board-7@@@u", xiaozhi.MQTTClientID{Group: "g", DeviceID: "board-7", UUID: "u"}},
		{"GID_g@@@board_7@@@u", xiaozhi.MQTTClientID{Group: "g", DeviceID: "board_7", UUID: "u"}},
		{"GID_@@@02_00_00_00_00_01@@@u", xiaozhi.MQTTClientID{}},                            // empty group
		{"gid_g@@@02_00_00_00_00_01@@@u", xiaozhi.MQTTClientID{}},                           // prefix is case-sensitive
		{"g@@@02_00_00_00_00_01@@@u", xiaozhi.MQTTClientID{}},                               // no GID_
		{"GID_g@@@02_00_00_00_00_01", xiaozhi.MQTTClientID{}},                               // two parts
		{"GID_g@@@02_00_00_00_00_01@@@", xiaozhi.MQTTClientID{}},                            // empty uuid
		{"GID_g@@@02_00_00_00_00_01@@@u@@@v", xiaozhi.MQTTClientID{}},                       // four parts
		{"GID_g@@@@@@u", xiaozhi.MQTTClientID{}},                                            // empty device
		{"GID_g@@@a/b@@@u", xiaozhi.MQTTClientID{}},                                         // topic separator
		{"GID_g@@@a+b@@@u", xiaozhi.MQTTClientID{}},                                         // wildcard
		{"GID_g#@@@02_00_00_00_00_01@@@u", xiaozhi.MQTTClientID{}},                          // wildcard in group
		{"GID_g@@@02_00_00_00_00_01@@@u u", xiaozhi.MQTTClientID{}},                         // space in uuid
		{"GID_g@@@02_00_00_00_00_01@@@" + strings.Repeat("u", 129), xiaozhi.MQTTClientID{}}, // long uuid
		{"GID_g@@@a:b@@@u", xiaozhi.MQTTClientID{}},                                         // ':' outside a MAC: its topic form a_b would be another id
		{"", xiaozhi.MQTTClientID{}},
		{"plain-client", xiaozhi.MQTTClientID{}},
	} {
		got, err := xiaozhi.ParseMQTTClientID(tt.in)
		if tt.want == (xiaozhi.MQTTClientID{}) {
			if err == nil || !errors.Is(err, xiaozhi.ErrBadDeviceID) {
				t.Errorf("ParseMQTTClientID(%q) = %+v, %v; want ErrBadDeviceID", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseMQTTClientID(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestMQTTClientIDString(t *testing.T) {
	id := xiaozhi.MQTTClientID{Group: "mcpgate", DeviceID: "02:00:00:00:00:01", UUID: "u-1"}
	if got, want := id.String(), "GID_mcpgate@@@02_00_00_00_00_01@@@u-1"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if got, want := xiaozhi.P2PTopic(id.DeviceID), "devices/p2p/02_00_00_00_00_01"; got != want {
		t.Fatalf("P2PTopic = %q, want %q", got, want)
	}
}

func FuzzParseMQTTClientID(f *testing.F) {
	for _, s := range []string{
		"GID_test@@@02_00_00_00_00_01@@@6f1d9e52-0000-4000-8000-000000000001",
		"GID_mcpgate@@@AA_BB_CC_DD_EE_FF@@@u", "GID_g@@@aa:bb:cc:dd:ee:ff@@@u", "GID_g@@@board-7@@@u",
		"GID_g@@@a:b@@@u", "GID_@@@02_00_00_00_00_01@@@u", "GID_g@@@02_00_00_00_00_01", "GID_g@@@@@@u",
		"GID_g@@@@x@@@u", "GID_g@@@x@@@@u", "GID_g@@@a/b@@@u", "GID_g@@@ 02_00_00_00_00_01 @@@u",
		"GID_g@@@设备@@@u", "GID_g@@@a\xffb@@@u", "", "@@@@@@",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		id, err := xiaozhi.ParseMQTTClientID(in)
		if err != nil {
			if !errors.Is(err, xiaozhi.ErrBadDeviceID) || id != (xiaozhi.MQTTClientID{}) {
				t.Fatalf("ParseMQTTClientID(%q) = %+v, %v", in, id, err)
			}
			return
		}
		if id.Group == "" || id.UUID == "" || id.DeviceID == "" {
			t.Fatalf("ParseMQTTClientID(%q) = %+v: an empty part", in, id)
		}
		// The device id is normalised: a MAC in its canonical form, and
		// normalising again changes nothing.
		if n, err := xiaozhi.NormalizeDeviceID(id.DeviceID); err != nil || n != id.DeviceID {
			t.Fatalf("ParseMQTTClientID(%q).DeviceID = %q, normalises to %q, %v", in, id.DeviceID, n, err)
		}
		if strings.Contains(id.DeviceID, ":") && !isCanonicalMAC(id.DeviceID) {
			t.Fatalf("ParseMQTTClientID(%q).DeviceID = %q: ':' outside a canonical MAC", in, id.DeviceID)
		}
		// The wire form round-trips: what the gateway derives (topic,
		// identity) is the same from the parsed id as from the input.
		again, err := xiaozhi.ParseMQTTClientID(id.String())
		if err != nil || again != id {
			t.Fatalf("round trip: %q -> %+v -> %q -> %+v, %v", in, id, id.String(), again, err)
		}
	})
}
