// Command lamp is the smallest useful device built with the mcpgate device
// SDK: a lamp that a gateway can switch over MCP.
//
//	go run ./examples/lamp --url ws://127.0.0.1:8000/xiaozhi/v1/ --mac 02:00:00:00:10:01
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/mcpgate/mcpgate/device"
)

func main() {
	url := flag.String("url", "ws://127.0.0.1:8000/xiaozhi/v1/", "gateway WebSocket URL")
	mac := flag.String("mac", "02:00:00:00:10:01", "device MAC address (its identity)")
	token := flag.String("token", "", "access token")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(ctx, log, *url, *mac, *token); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("lamp stopped", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, url, mac, token string) error {
	srv, err := device.NewServer(device.ServerOptions{Profile: device.ProfileESP32, Name: "lamp-example", Version: "1.0.0", Logger: log})
	if err != nil {
		return err
	}
	l := &lamp{}
	for _, t := range l.tools() {
		if err := srv.AddTool(t); err != nil {
			return err
		}
	}
	client, err := device.NewClient(device.ClientOptions{
		URL:      url,
		DeviceID: mac,
		Token:    token,
		Server:   srv,
		Logger:   log,
		OnState: func(s device.State) {
			log.Info("connection", "status", s.Status, "session_id", s.SessionID, "error", s.Err)
		},
	})
	if err != nil {
		return err
	}
	return client.Run(ctx)
}

// lamp is the hardware: one switch.
type lamp struct {
	mu sync.Mutex
	on bool
}

func (l *lamp) set(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = on
	fmt.Printf("lamp is now %s\n", map[bool]string{true: "ON", false: "off"}[on])
}

func (l *lamp) tools() []device.Tool {
	return []device.Tool{
		{
			Name:        "self.lamp.get_state",
			Description: "Get the power state of the lamp",
			Handler: func(context.Context, device.Args) (any, error) {
				l.mu.Lock()
				defer l.mu.Unlock()
				return map[string]bool{"power": l.on}, nil
			},
		},
		{
			Name:        "self.lamp.turn_on",
			Description: "Turn on the lamp",
			Handler: func(context.Context, device.Args) (any, error) {
				l.set(true)
				return true, nil
			},
		},
		{
			Name:        "self.lamp.turn_off",
			Description: "Turn off the lamp",
			Handler: func(context.Context, device.Args) (any, error) {
				l.set(false)
				return true, nil
			},
		},
	}
}
