// Command mcpgate-device turns a Linux board (Raspberry Pi, Orange Pi...)
// into a XiaoZhi-style device that serves tool packs: an infrared remote
// over a serial IR module, system status and volume, a camera. It connects
// to an mcpgate gateway, serves MCP over stdio, or dials an MCP endpoint.
// Run "mcpgate-device --help"; docs/device-agent.md has the details.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd(os.Stdin, os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpgate-device:", err)
		os.Exit(1)
	}
}
