package ws_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/hub"
)

// A byte that is not UTF-8 inside a device's strings spoils that text, not
// the reply: a description cut mid-character keeps every tool listed, and a
// result in GBK reaches the caller, each bad byte read as U+FFFD
// (docs/hostile-input.md).
func TestInvalidUTF8InDeviceStrings(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	d := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:f8:01",
		Tools: []json.RawMessage{
			json.RawMessage(devicetest.SetVolumeTool),
			json.RawMessage("{\"name\":\"self.light.on\",\"description\":\"打开客\xe5\x8e\",\"inputSchema\":{\"type\":\"object\",\"properties\":{}}}"),
			json.RawMessage(`{"name":"self.wifi.name","description":"WiFi","inputSchema":{"type":"object","properties":{}}}`),
		},
		OnCall: func(c devicetest.Call) devicetest.Answer {
			return devicetest.Answer{Result: json.RawMessage("{\"content\":[{\"type\":\"text\",\"text\":\"\xd6\xd0\xce\xc4WiFi\"}],\"isError\":false}")}
		},
	})
	dev, cat, err := s.hub.Tools(d.ID())
	if err != nil {
		t.Fatal(err)
	}
	if dev.State != hub.StateReady || cat.Len() != 3 {
		t.Fatalf("state %s, %d tools (last error %q); want ready with 3", dev.State, cat.Len(), dev.LastError)
	}
	if tool, ok := cat.Tool("self.light.on"); !ok || tool.Description != "打开客\uFFFD\uFFFD" {
		t.Errorf("self.light.on: %+v, %v; want description %q", tool, ok, "打开客\uFFFD\uFFFD")
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	res, err := s.hub.Call(ctx, hub.CallRequest{Device: d.ID(), Tool: "self.wifi.name"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "\uFFFD\uFFFD\uFFFD\uFFFDWiFi"; res.Text() != want {
		t.Errorf("result text %q, want %q", res.Text(), want)
	}
}

// A caller's arguments reach the device in valid UTF-8 (RFC 6455 requires
// it of a text frame): each byte of a string that is not UTF-8 as U+FFFD.
func TestCallerInvalidUTF8ReachesDeviceAsValid(t *testing.T) {
	t.Parallel()
	s := startGateway(t, gateway.Config{})
	d := connectReady(t, s, devicetest.Config{ID: "02:00:00:00:f8:02", Tools: []json.RawMessage{
		json.RawMessage(`{"name":"self.say","description":"say","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}`),
	}})
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if _, err := s.hub.Call(ctx, hub.CallRequest{Device: d.ID(), Tool: "self.say",
		Arguments: json.RawMessage("{\"text\":\"bad\xff\xfe bytes\"}")}); err != nil {
		t.Fatal(err)
	}
	calls := d.Calls()
	if want := "{\"text\":\"bad\uFFFD\uFFFD bytes\"}"; len(calls) != 1 || string(calls[0].Arguments) != want {
		t.Fatalf("device got %+v, want arguments %q", calls, want)
	}
}
