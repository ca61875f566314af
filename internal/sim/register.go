package sim

import (
	"context"
	"errors"
	"fmt"

	"github.com/mcpgate/mcpgate/device"
)

// errRegisterMQTT: the registration dialect exists on WebSocket only.
var errRegisterMQTT = errors.New("sim: the register profile speaks WebSocket only; use a WebSocket URL, not MQTT")

// registerTools is the catalog of a device.ProfileRegister device: the
// firmware's tools under the flat names of the registration dialect (seed
// 001), each with its sub type: set_* and turn_* are controls (the gateway
// answers at once), get_* are queries (awaited). get_time is a "local" tool:
// the device declares it and the gateway runs it (a built-in), so the device's
// own handler only runs if the gateway sends it anyway.
func (d *Device) registerTools() []device.Tool {
	b := d.board
	control := func(name, desc string, props []device.Property, h device.Handler) device.Tool {
		return device.Tool{Name: name, Description: desc, Properties: props, Handler: h, MainType: "remote", SubType: "control"}
	}
	query := func(name, desc string, h device.Handler) device.Tool {
		return device.Tool{Name: name, Description: desc, Handler: h, MainType: "remote", SubType: "query"}
	}
	set := func(field *int, arg string) device.Handler {
		return func(_ context.Context, a device.Args) (any, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			*field = a.Int(arg)
			return map[string]any{"status": "success", "value": *field}, nil
		}
	}
	return []device.Tool{
		query("get_device_status", descDeviceStatus, func(context.Context, device.Args) (any, error) {
			return b.status(), nil
		}),
		query("get_volume", "Get the current volume of the audio speaker (0-100).", func(context.Context, device.Args) (any, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			return map[string]int{"volume": b.volume}, nil
		}),
		control("set_volume", "Set the volume of the audio speaker, 0 (mute) to 100 (loudest).",
			[]device.Property{device.Int("volume", 0, 100)}, set(&b.volume, "volume")),
		control("set_brightness", "Set the brightness of the screen, 0 to 100.",
			[]device.Property{device.Int("brightness", 0, 100)}, set(&b.brightness, "brightness")),
		control("set_theme", "Set the theme of the screen: light or dark.",
			[]device.Property{device.Str("theme")}, func(_ context.Context, a device.Args) (any, error) {
				theme := a.String("theme")
				if theme != "light" && theme != "dark" {
					return nil, &device.ToolError{Code: device.CodeToolFailed, Message: fmt.Sprintf("unknown theme %q: use light or dark", theme)}
				}
				b.mu.Lock()
				defer b.mu.Unlock()
				b.theme = theme
				return map[string]string{"status": "success", "theme": theme}, nil
			}),
		control("turn_on_lamp", "Turn the lamp on.", nil, func(context.Context, device.Args) (any, error) {
			return map[string]bool{"power": b.setLamp(true)}, nil
		}),
		control("turn_off_lamp", "Turn the lamp off.", nil, func(context.Context, device.Args) (any, error) {
			b.setLamp(false)
			return map[string]bool{"power": false}, nil
		}),
		{Name: "get_time", Description: "Get the current date and time.", MainType: "local", SubType: "query",
			Handler: func(context.Context, device.Args) (any, error) {
				return nil, fmt.Errorf("get_time is local: the gateway runs it")
			}},
	}
}
