package mqtt_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/transport/mqtt"
)

// A byte that is not UTF-8 inside an MQTT device's strings spoils that
// text, not the reply: a description cut mid-character keeps every tool
// listed, and a result in GBK reaches the caller, each bad byte read as
// U+FFFD (docs/hostile-input.md).
func TestInvalidUTF8InDeviceStrings(t *testing.T) {
	t.Parallel()
	h, tr, _, _ := bareBroker(t, mqtt.Config{})
	mac := "02:00:00:01:f8:01"
	dialScripted(t, tr.Addr(), mac, func(ctx context.Context, payload []byte) []byte {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(payload, &req) != nil || len(req.ID) == 0 {
			return nil
		}
		var result string
		switch req.Method {
		case "initialize":
			result = `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"board","version":"1"}}`
		case "tools/list":
			result = "{\"tools\":[" +
				"{\"name\":\"self.light.on\",\"description\":\"打开客\xe5\x8e\",\"inputSchema\":{\"type\":\"object\",\"properties\":{}}}," +
				`{"name":"self.wifi.name","description":"WiFi","inputSchema":{"type":"object","properties":{}}}]}`
		case "tools/call":
			result = "{\"content\":[{\"type\":\"text\",\"text\":\"\xd6\xd0\xce\xc4WiFi\"}],\"isError\":false}"
		default:
			return nil
		}
		return []byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":` + result + `}`)
	}, 0)
	waitState(t, h, mac, hub.StateReady)
	dev, cat, err := h.Tools(mac)
	if err != nil {
		t.Fatal(err)
	}
	if cat.Len() != 2 {
		t.Fatalf("%d tools (last error %q), want 2", cat.Len(), dev.LastError)
	}
	if tool, ok := cat.Tool("self.light.on"); !ok || tool.Description != "打开客\uFFFD\uFFFD" {
		t.Errorf("self.light.on: %+v, %v; want description %q", tool, ok, "打开客\uFFFD\uFFFD")
	}
	ctx, cancel := context.WithTimeout(context.Background(), hostiletest.WaitTimeout)
	defer cancel()
	res, err := h.Call(ctx, hub.CallRequest{Device: mac, Tool: "self.wifi.name"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "\uFFFD\uFFFD\uFFFD\uFFFDWiFi"; res.Text() != want {
		t.Errorf("result text %q, want %q", res.Text(), want)
	}
}
