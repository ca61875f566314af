package xiaozhi_test

import (
	"encoding/json"
	"fmt"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

func ExampleNormalizeDeviceID() {
	for _, id := range []string{
		"AA-BB-CC-DD-EE-FF",                    // Device-Id header of some boards
		"aa_bb_cc_dd_ee_ff",                    // MQTT client id and topic form
		"AABBCCDDEEFF",                         // bare hex
		"7b94d69a-9808-4c59-9c9b-3f3e7f3b2a10", // not a MAC: kept
		"kitchen/speaker",                      // would break a topic or path
	} {
		norm, err := xiaozhi.NormalizeDeviceID(id)
		fmt.Printf("%q %v\n", norm, err)
	}
	// Output:
	// "aa:bb:cc:dd:ee:ff" <nil>
	// "aa:bb:cc:dd:ee:ff" <nil>
	// "aa:bb:cc:dd:ee:ff" <nil>
	// "7b94d69a-9808-4c59-9c9b-3f3e7f3b2a10" <nil>
	// "" xiaozhi: invalid device id: "kitchen/speaker" contains a forbidden character
}

func ExampleMACTopicForm() {
	id, err := xiaozhi.NormalizeDeviceID("AA:BB:CC:DD:EE:FF")
	if err != nil {
		panic(err)
	}
	fmt.Println("devices/p2p/" + xiaozhi.MACTopicForm(id))
	// Output:
	// devices/p2p/aa_bb_cc_dd_ee_ff
}

func ExampleDecodeEnvelope() {
	frame := []byte(`{"type":"hello","version":1,"features":{"mcp":true,"aec":true},"transport":"websocket","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)
	env, err := xiaozhi.DecodeEnvelope(frame)
	if err != nil {
		panic(err)
	}
	hello, err := env.Hello()
	if err != nil {
		panic(err)
	}
	fmt.Println(env.Type, hello.SupportsMCP())

	// Answer before sending any MCP message.
	reply, err := json.Marshal(xiaozhi.ServerHello("sess-1", xiaozhi.DefaultServerAudio))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(reply))

	mcp, err := xiaozhi.MCPEnvelope("sess-1", json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(mcp))
	// Output:
	// hello true
	// {"type":"hello","transport":"websocket","session_id":"sess-1","audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}
	// {"session_id":"sess-1","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"method":"tools/list"}}
}
