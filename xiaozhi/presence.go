package xiaozhi

// Presence messages of the external-broker mode. A stock broker does not
// tell its subscribers when a client connects or disconnects, so a device
// that wants to be seen at once announces itself on its uplink topic after
// CONNECT (TypeOnline) and leaves an MQTT Will that the broker publishes on
// an abrupt disconnect (TypeOffline). Firmware sends neither; the gateway
// then learns of it from its first message and ages it out after a silence.
// Gateways that do not know these types ignore them.
const (
	TypeOnline  = "online"
	TypeOffline = "offline"
)

// DeviceUplinkTopic returns a device's own uplink topic,
// <uplink>/<mac_with_underscores>, which carries its identity for a gateway
// that is a subscriber of an external broker and cannot see client ids.
func DeviceUplinkTopic(uplink, deviceID string) string {
	return uplink + "/" + MACTopicForm(deviceID)
}
