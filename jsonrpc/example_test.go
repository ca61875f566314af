package jsonrpc_test

import (
	"errors"
	"fmt"

	"github.com/mcpgate/mcpgate/jsonrpc"
)

func ExampleDecode() {
	// ESP32 firmware reports a failed tool call without an error code.
	msg, err := jsonrpc.Decode([]byte(`{"jsonrpc":"2.0","id":4,"error":{"message":"Unknown tool: self.lamp.turn_on"}}`))
	if err != nil {
		panic(err)
	}
	id, _ := msg.ID.Int32()
	fmt.Println(msg.Kind(), id)
	fmt.Println(msg.Error.CodeOr(jsonrpc.CodeInternalError), msg.Error)

	// It does not escape quotes in that message either: such a frame cannot be
	// parsed, and the call it answers must end by its own timeout.
	_, err = jsonrpc.Decode([]byte(`{"jsonrpc":"2.0","id":5,"error":{"message":"Unknown tool: a"b"}}`))
	fmt.Println(errors.Is(err, jsonrpc.ErrNotJSON))
	// Output:
	// response 4
	// -32603 Unknown tool: self.lamp.turn_on
	// true
}

func ExampleID() {
	// A reply echoes the request id byte for byte, whatever its form.
	req, err := jsonrpc.Decode([]byte(`{"jsonrpc":"2.0","id":"07","method":"ping"}`))
	if err != nil {
		panic(err)
	}
	reply := jsonrpc.NewErrorResponse(req.ID, jsonrpc.NewError(jsonrpc.CodeMethodNotFound, "Method not implemented: ping"))
	b, err := reply.Encode()
	if err != nil {
		panic(err)
	}
	fmt.Println(string(b))
	// Output:
	// {"jsonrpc":"2.0","id":"07","error":{"code":-32601,"message":"Method not implemented: ping"}}
}

func ExampleNewRequest() {
	msg, err := jsonrpc.NewRequest(jsonrpc.IntID(1), "tools/list", map[string]any{"cursor": "self.screen.set_theme"})
	if err != nil {
		panic(err)
	}
	b, err := msg.Encode()
	if err != nil {
		panic(err)
	}
	fmt.Println(string(b))
	// Output:
	// {"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"self.screen.set_theme"}}
}
