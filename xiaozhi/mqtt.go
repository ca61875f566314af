package xiaozhi

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MQTT names of the ecosystem: devices publish every message to the uplink
// topic the OTA reply names (usually DefaultUplinkTopic) and receive on their
// own peer-to-peer topic, which they never subscribe to.
const (
	DefaultUplinkTopic = "device-server"
	P2PTopicPrefix     = "devices/p2p/"
	// DefaultMQTTGroup is the group of client ids the gateway hands out.
	DefaultMQTTGroup = "mcpgate"
)

// P2PTopic returns the downlink topic of a device, devices/p2p/<mac_with_underscores>.
func P2PTopic(deviceID string) string { return P2PTopicPrefix + MACTopicForm(deviceID) }

// MQTTClientID is what an MQTT device connects with.
type MQTTClientID struct {
	Group    string // without the GID_ prefix
	DeviceID string // normalised
	UUID     string
}

// String returns the wire form GID_<group>@@@<mac_with_underscores>@@@<uuid>.
func (c MQTTClientID) String() string {
	return "GID_" + c.Group + "@@@" + MACTopicForm(c.DeviceID) + "@@@" + c.UUID
}

// Check reports whether c survives its wire form: String parses back
// (ParseMQTTClientID) to c itself, so a broker reading the client id finds
// the same group, device and uuid. One that does not is either refused at
// CONNECT (a space, "@@@") or read as another device (a:b comes back as
// a_b). c.DeviceID must be normalised (NormalizeDeviceID).
func (c MQTTClientID) Check() error {
	back, err := ParseMQTTClientID(c.String())
	if err != nil {
		return err
	}
	if back != c {
		return fmt.Errorf("%w: client id %q reads back as group %q, device %q, uuid %q", ErrBadDeviceID, c.String(), back.Group, back.DeviceID, back.UUID)
	}
	return nil
}

// ParseMQTTClientID parses GID_<group>@@@<mac_with_underscores>@@@<uuid>. The
// device part may be any form NormalizeDeviceID accepts, but a ':' only in a
// MAC; the group and uuid must be non-empty UTF-8 and free of spaces,
// control characters and MQTT wildcards. A parsed id's String parses back to it.
func ParseMQTTClientID(s string) (MQTTClientID, error) {
	parts := strings.Split(s, "@@@")
	if len(parts) != 3 {
		return MQTTClientID{}, fmt.Errorf("%w: client id %q: want GID_<group>@@@<mac_with_underscores>@@@<uuid>", ErrBadDeviceID, s)
	}
	group, ok := strings.CutPrefix(parts[0], "GID_")
	if !ok || !plainToken(group) {
		return MQTTClientID{}, fmt.Errorf("%w: client id %q: the group must be GID_ followed by a name", ErrBadDeviceID, s)
	}
	// NormalizeDeviceID trims spaces; a device part with any would not be
	// the one String writes back (" @" would become "@" and merge with
	// the separator before it).
	if !plainToken(parts[1]) {
		return MQTTClientID{}, fmt.Errorf("%w: client id %q: missing or invalid device id", ErrBadDeviceID, s)
	}
	if !plainToken(parts[2]) {
		return MQTTClientID{}, fmt.Errorf("%w: client id %q: missing or invalid uuid", ErrBadDeviceID, s)
	}
	id, err := NormalizeDeviceID(parts[1])
	if err != nil {
		return MQTTClientID{}, fmt.Errorf("client id %q: %w", s, err)
	}
	// The wire and topic forms write ':' as '_': a device id that is not a
	// MAC but has a ':' would come back as another id (a:b as a_b) and share
	// its downlink topic.
	if _, isMAC := ParseMAC(id); !isMAC && strings.Contains(id, ":") {
		return MQTTClientID{}, fmt.Errorf("%w: client id %q: a device id other than a MAC must not contain ':'", ErrBadDeviceID, s)
	}
	return MQTTClientID{Group: group, DeviceID: id, UUID: parts[2]}, nil
}

// plainToken: MQTT strings are UTF-8, and a device would store an invalid
// sequence from the OTA reply's JSON as U+FFFD, another client id.
func plainToken(s string) bool {
	if s == "" || len(s) > 128 || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) || unicode.IsSpace(r) || r == '/' || r == '+' || r == '#' {
			return false
		}
	}
	return true
}
