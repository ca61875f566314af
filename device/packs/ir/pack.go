package ir

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpgate/mcpgate/device"
)

// Defaults of [Config].
const (
	DefaultLearnTimeout = 15 * time.Second
	maxLearnSeconds     = 60
)

// MaxCodeLen is the longest code a frame carries.
const MaxCodeLen = MaxFrameLen - FrameOverhead

// Config configures a [Pack].
type Config struct {
	// Module is the serial module's configuration.
	Module ModuleConfig
	// CodesFile is the JSON file of named codes; required.
	CodesFile string
}

// Pack is the IR tool pack: the tools of py-xiaozhi's IR manager plus the
// module's internal slots and its settings. It is safe for concurrent use.
type Pack struct {
	mod   *Module
	codes *Codes
}

// New returns the pack. It does not open the port: a module plugged in
// later works, and a missing one fails each call with the reason.
func New(cfg Config) (*Pack, error) {
	if cfg.CodesFile == "" {
		return nil, errors.New("ir: Config.CodesFile is required")
	}
	mod, err := NewModule(cfg.Module)
	if err != nil {
		return nil, err
	}
	return &Pack{mod: mod, codes: NewCodes(cfg.CodesFile)}, nil
}

// Module returns the pack's module driver.
func (p *Pack) Module() *Module { return p.mod }

// Codes returns the pack's code store.
func (p *Pack) Codes() *Codes { return p.codes }

// Close closes the serial port.
func (p *Pack) Close() error { return p.mod.Close() }

// Tools returns the pack's tools.
func (p *Pack) Tools() []device.Tool {
	return []device.Tool{
		{
			Name: "self.ir.list_codes",
			Description: "List the infrared remote codes saved on this device, by name. Use a name with " +
				"self.ir.send_named to press that remote button (TV power, air conditioner on, ...).",
			Handler: p.listCodes,
		},
		{
			Name:        "self.ir.send_named",
			Description: "Send a saved infrared code by name, as if pressing that button on the remote. Names come from self.ir.list_codes.",
			Properties:  []device.Property{device.Str("name")},
			Handler:     p.sendNamed,
		},
		{
			Name:        "self.ir.send_hex",
			Description: "Send a raw infrared code given as hex bytes (e.g. \"A1 B2 C3\"), for codes not saved under a name.",
			Properties:  []device.Property{device.Str("hex")},
			Handler:     p.sendHex,
		},
		{
			Name: "self.ir.learn_external",
			Description: "Learn an infrared code from a remote control and save it under a name: call it, then point the " +
				"remote at the device and press the button within timeout_s seconds. An existing code of that name is replaced.",
			Properties: []device.Property{device.Str("name"), device.IntDefault("timeout_s", int(DefaultLearnTimeout/time.Second), 1, maxLearnSeconds)},
			Handler:    p.learnExternal,
		},
		{
			Name:        "self.ir.delete_code",
			Description: "Delete a saved infrared code by name.",
			Properties:  []device.Property{device.Str("name")},
			Handler:     p.deleteCode,
		},
		{
			Name: "self.ir.learn_internal",
			Description: "Learn an infrared code into one of the IR module's own memory slots (0-6): call it, then press " +
				"the remote's button at the module within timeout_s seconds.",
			Properties: []device.Property{device.Int("index", 0, 6), device.IntDefault("timeout_s", int(DefaultLearnTimeout/time.Second), 1, maxLearnSeconds)},
			Handler:    p.learnInternal,
		},
		{
			Name:        "self.ir.send_internal",
			Description: "Send the infrared code stored in one of the IR module's own memory slots (0-6).",
			Properties:  []device.Property{device.Int("index", 0, 6)},
			Handler:     p.sendInternal,
		},
		{
			Name:        "self.ir.module_info",
			Description: "Show the IR module's serial port, baud rate and address, and check that it answers.",
			Handler:     p.moduleInfo,
		},
	}
}

func (p *Pack) listCodes(ctx context.Context, _ device.Args) (any, error) {
	codes, err := p.codes.List()
	if err != nil {
		return nil, err
	}
	return struct {
		Codes []CodeInfo `json:"codes"`
	}{codes}, nil
}

func (p *Pack) sendNamed(ctx context.Context, a device.Args) (any, error) {
	name := a.String("name")
	code, err := p.codes.Get(name)
	if err != nil {
		return nil, err
	}
	return p.send(ctx, code, fmt.Sprintf("sent %q (%d bytes)", name, len(code)))
}

func (p *Pack) sendHex(ctx context.Context, a device.Args) (any, error) {
	code, err := ParseHex(a.String("hex"))
	if err != nil {
		return nil, fmt.Errorf("invalid hex code: %w", err)
	}
	return p.send(ctx, code, fmt.Sprintf("sent %d bytes", len(code)))
}

func (p *Pack) send(ctx context.Context, code []byte, done string) (any, error) {
	if len(code) > MaxCodeLen {
		return nil, fmt.Errorf("code of %d bytes is longer than a frame carries (%d)", len(code), MaxCodeLen)
	}
	acked, err := p.mod.Send(ctx, code)
	if err != nil {
		return nil, err
	}
	if acked {
		return done + "; the module confirmed", nil
	}
	return done + " (the module sends no confirmation)", nil
}

func (p *Pack) learnExternal(ctx context.Context, a device.Args) (any, error) {
	name := a.String("name")
	if err := CheckName(name); err != nil {
		return nil, err
	}
	code, err := p.mod.Learn(ctx, time.Duration(a.Int("timeout_s"))*time.Second)
	if err != nil {
		return nil, err
	}
	replaced, err := p.codes.Put(name, code)
	if err != nil {
		return nil, fmt.Errorf("learned %d bytes but could not save them: %w", len(code), err)
	}
	if replaced {
		return fmt.Sprintf("learned %q (%d bytes), replacing the old code", name, len(code)), nil
	}
	return fmt.Sprintf("learned %q (%d bytes)", name, len(code)), nil
}

func (p *Pack) deleteCode(ctx context.Context, a device.Args) (any, error) {
	name := a.String("name")
	if err := p.codes.Delete(name); err != nil {
		return nil, err
	}
	return fmt.Sprintf("deleted %q", name), nil
}

func (p *Pack) learnInternal(ctx context.Context, a device.Args) (any, error) {
	i := a.Int("index")
	if err := p.mod.LearnSlot(ctx, i, time.Duration(a.Int("timeout_s"))*time.Second); err != nil {
		return nil, err
	}
	return fmt.Sprintf("learned into slot %d", i), nil
}

func (p *Pack) sendInternal(ctx context.Context, a device.Args) (any, error) {
	i := a.Int("index")
	acked, err := p.mod.SendSlot(ctx, i)
	if err != nil {
		return nil, err
	}
	if acked {
		return fmt.Sprintf("sent slot %d; the module confirmed", i), nil
	}
	return fmt.Sprintf("sent slot %d (the module sends no confirmation)", i), nil
}

func (p *Pack) moduleInfo(ctx context.Context, _ device.Args) (any, error) {
	baud, err := p.mod.BaudRate(ctx)
	if err != nil {
		return nil, err
	}
	addr, err := p.mod.Address(ctx)
	if err != nil {
		return nil, err
	}
	return struct {
		Port        string `json:"port"`
		PortBaud    int    `json:"port_baud"`
		ModuleBaud  int    `json:"module_baud"`
		Address     string `json:"address"`
		CodesFile   string `json:"codes_file"`
		MaxCodeSize int    `json:"max_code_bytes"`
	}{p.mod.Port(), p.mod.Baud(), baud, fmt.Sprintf("0x%02X", addr), p.codes.Path(), MaxCodeLen}, nil
}
