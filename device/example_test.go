package device_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

func ExampleServer_Handle() {
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "lamp-board", Version: "1.0.0"})
	if err != nil {
		log.Fatal(err)
	}
	lampOn := false
	err = srv.AddTool(device.Tool{
		Name:        "self.lamp.set",
		Description: "Turn the lamp on or off.",
		Properties:  []device.Property{device.Bool("on")},
		Handler: func(ctx context.Context, args device.Args) (any, error) {
			lampOn = args.Bool("on")
			return true, nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, req := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"self.lamp.set","arguments":{"on":true}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"self.lamp.set","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":"four","method":"tools/list"}`, // firmware ignores string ids
	} {
		fmt.Printf("%s\n", srv.Handle(ctx, []byte(req)))
	}
	fmt.Println("lamp on:", lampOn)
	// Output:
	// {"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"self.lamp.set","description":"Turn the lamp on or off.","inputSchema":{"type":"object","properties":{"on":{"type":"boolean"}},"required":["on"]}}]}}
	// {"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}
	// {"jsonrpc":"2.0","id":3,"error":{"message":"Missing valid argument: on"}}
	//
	// lamp on: true
}

func ExampleClient_Run() {
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32})
	if err != nil {
		log.Fatal(err)
	}
	client, err := device.NewClient(device.ClientOptions{
		URL:      "ws://127.0.0.1:8000/xiaozhi/v1/",
		DeviceID: "02:00:00:00:00:01",
		Server:   srv,
		OnState: func(s device.State) {
			log.Printf("%s %s %v", s.Status, s.SessionID, s.Err)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = client.Run(ctx) // reconnects until ctx ends
}
