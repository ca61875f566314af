package mcpserver_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/internal/devicetest"
	"github.com/mcpgate/mcpgate/internal/gateway"
)

// sendLog makes d send a notifications/message.
func sendLog(t testing.TB, d *devicetest.Device, params string) {
	t.Helper()
	frame := `{"session_id":"` + d.SessionID() + `","type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/message","params":` + params + `}}`
	if err := d.Send(context.Background(), websocket.MessageText, []byte(frame)); err != nil {
		t.Error(err)
	}
}

// A device's log messages during a call reach the client that made it, on
// either door, without the client setting a level first; once it sets one,
// messages below it stay away.
func TestLogsReachTheCaller(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	var d *devicetest.Device
	d = fake(t, gw, devicetest.Config{ID: "02:00:00:00:0b:01",
		OnCall: func(devicetest.Call) devicetest.Answer {
			sendLog(t, d, `{"level":"info","logger":"speaker","data":"turning it up"}`)
			sendLog(t, d, `{"level":"error","data":{"amp":"hot"}}`)
			sendLog(t, d, `{"level":"LOUD","data":"a level MCP does not know"}`)
			return devicetest.Answer{Result: devicetest.TextResult("done", false)}
		}})
	dev, _ := gw.Hub().Device(d.ID())
	for door, tc := range map[string]struct{ url, tool string }{
		"device":    {"http://" + gw.Addr() + "/mcp/devices/" + d.ID(), "self.audio_speaker.set_volume"},
		"aggregate": {"http://" + gw.Addr() + "/mcp", dev.Alias + ".self.audio_speaker.set_volume"},
	} {
		for _, v := range versions {
			t.Run(door+"/"+v, func(t *testing.T) {
				c := connect(t, tc.url, v)
				call := func() {
					t.Helper()
					res, err := c.CallTool(context.Background(), &mcp.CallToolParams{Name: tc.tool, Arguments: map[string]any{"volume": 1}})
					if err != nil || res.IsError {
						t.Fatalf("call = %+v %v", res, err)
					}
				}
				call()
				waitFor(t, "three log messages", func() bool { return len(c.logged()) >= 3 })
				got := c.logged()
				if len(got) != 3 {
					t.Fatalf("got %d log messages, want 3", len(got))
				}
				want := []struct {
					level, logger, data string
				}{{"info", "speaker", `"turning it up"`}, {"error", "", `{"amp":"hot"}`}, {"info", "", `"a level MCP does not know"`}}
				for i, w := range want {
					data, _ := json.Marshal(got[i].Data)
					if string(got[i].Level) != w.level || got[i].Logger != w.logger || string(data) != w.data {
						t.Errorf("log %d = %s %q %s, want %s %q %s", i, got[i].Level, got[i].Logger, data, w.level, w.logger, w.data)
					}
				}

				if err := c.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "warning"}); err != nil {
					t.Fatal(err)
				}
				call()
				waitFor(t, "the error of the second call", func() bool { return len(c.logged()) >= 4 })
				time.Sleep(50 * time.Millisecond) // room for a message that should not come
				if got := c.logged(); len(got) != 4 || got[3].Level != "error" {
					t.Fatalf("after setLevel warning: %d messages, the 4th %+v; want only the error", len(got), got[3])
				}
			})
		}
	}
}

// A log message no call owns (sent between calls) goes to every session of
// the device's door, and not to the aggregate's.
func TestSessionWideLogs(t *testing.T) {
	gw := startGateway(t, gateway.Config{})
	d := fake(t, gw, devicetest.Config{ID: "02:00:00:00:0b:02"})
	own := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), versions[1])
	other := connect(t, "http://"+gw.Addr()+"/mcp/devices/"+d.ID(), versions[0])
	agg := connect(t, "http://"+gw.Addr()+"/mcp", versions[1])
	// The sessions' GET streams open asynchronously: resend until both hear.
	waitFor(t, "the message on both sessions of the device's door", func() bool {
		sendLog(t, d, `{"level":"notice","logger":"battery","data":"low"}`)
		time.Sleep(20 * time.Millisecond)
		return len(own.logged()) > 0 && len(other.logged()) > 0
	})
	for _, c := range []*client{own, other} {
		if m := c.logged()[0]; m.Level != "notice" || m.Logger != "battery" || m.Data != "low" {
			t.Errorf("message = %+v", m)
		}
	}
	if n := len(agg.logged()); n != 0 {
		t.Errorf("the aggregate got %d session-wide messages of a device", n)
	}
}
