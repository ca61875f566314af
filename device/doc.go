// Package device is a Go SDK for XiaoZhi-style voice devices: it plays the
// device side of the protocol, where the device runs an MCP server inside
// its own session and the gateway is the MCP client.
//
// A device has two parts:
//
//   - a [Server], which owns the tools and answers JSON-RPC messages
//     (initialize, tools/list with paging, tools/call with argument
//     validation) exactly the way a chosen [Profile] does: ESP32 firmware,
//     py-xiaozhi, or a spec-following MCP server; or, with
//     [ProfileRegister], the registration dialect of seed 001
//     (mcp/registerTools, mcp/tool/execute, mcp/ai/message; register.go);
//   - a [Client], which dials the gateway over WebSocket, sends the headers
//     and hello firmware sends, serves MCP envelopes through the Server, and
//     reconnects with jittered backoff until its context ends.
//
// The Server keeps its state (tools, the vision endpoint from initialize)
// across connections, as a real device does; reuse one Server for the
// device's whole life.
//
// # Defining tools
//
// A tool has typed properties. A property without a default is required;
// integers may carry a range. The handler receives validated [Args] with
// defaults applied and returns a value that becomes the tool's text (bool,
// integer, string, or JSON of anything else) or a [*ToolResult] for rich
// content:
//
//	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "my-board", Version: "1.0.0"})
//	if err != nil { ... }
//	err = srv.AddTool(device.Tool{
//		Name:        "self.audio_speaker.set_volume",
//		Description: "Set the volume of the audio speaker.",
//		Properties:  []device.Property{device.Int("volume", 0, 100)},
//		Handler: func(ctx context.Context, args device.Args) (any, error) {
//			setVolume(args.Int("volume"))
//			return true, nil
//		},
//	})
//
// # Connecting
//
//	client, err := device.NewClient(device.ClientOptions{
//		URL:      "ws://gateway:8080/xiaozhi/v1/",
//		DeviceID: "02:00:00:00:00:01",
//		Token:    "device-token",
//		Server:   srv,
//	})
//	if err != nil { ... }
//	err = client.Run(ctx) // returns when ctx ends
//
// For tests, [Client.Connect] establishes one session and [Session.Serve]
// serves it until the connection breaks.
//
// A session cancels a tool handler's ctx when the gateway sends
// notifications/cancelled for its request, and then sends no reply; it
// sends notifications/tools/list_changed when tools are added or removed.
// A program with a transport of its own gets the same from a [Conn].
//
// # Profiles
//
// The profiles differ where real devices differ (see the project's
// PROTOCOL.md): which ids get an answer, whether errors carry a code, whether
// a bad argument is a JSON-RPC error or an isError result, what an unknown
// paging cursor or an oversized tool yields, and whether tool calls run one
// at a time. [ProfileESP32] even reproduces firmware's unescaped error
// messages, which can produce a frame that is not valid JSON: a gateway has
// to survive that.
//
// [Server.Handle] processes a single message without any transport, which
// makes profiles easy to explore:
//
//	reply := srv.Handle(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
package device
