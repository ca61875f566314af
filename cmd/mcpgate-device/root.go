package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/device/packs/ir"
	"github.com/mcpgate/mcpgate/internal/devagent"
	"github.com/mcpgate/mcpgate/internal/flagconfig"
	"github.com/mcpgate/mcpgate/internal/suggest"
)

// version is set with -ldflags "-X main.version=...".
var version string

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// options are the settings every command shares; each is a flag and a key
// of the YAML config file.
type options struct {
	config, stateDir, id, packs, logLevel string
	irPort                                string
	irBaud, irAddr                        int
	irTimeout                             time.Duration
	mixer, amixerControl                  string
	camera, capture, resolution           string
}

func (o *options) flags(fs *pflag.FlagSet) {
	fs.StringVar(&o.config, "config", "", "YAML config file; its keys are these flags' names (e.g. ir-port: /dev/ttyUSB0)")
	fs.StringVar(&o.stateDir, "state-dir", devagent.DefaultStateDir(), "where the device id and the IR codes are kept")
	fs.StringVar(&o.id, "id", "", "device id, a MAC address such as 02:00:00:00:00:01 (- or _ or no separators too; default: a random one made on first run, kept in the state dir)")
	fs.StringVar(&o.packs, "packs", strings.Join(devagent.Packs, ","), "tool packs to serve, comma-separated: "+strings.Join(devagent.Packs, ", "))
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&o.irPort, "ir-port", ir.DefaultPort, "serial port of the IR module (env IR_SERIAL_PORT too)")
	fs.IntVar(&o.irBaud, "ir-baud", ir.DefaultBaud, "baud rate of the IR module (env IR_BAUD too)")
	fs.IntVar(&o.irAddr, "ir-addr", ir.Broadcast, "IR module address; 255 (0xFF) reaches any module")
	fs.DurationVar(&o.irTimeout, "ir-timeout", ir.DefaultTimeout, "how long to wait for the IR module's answers")
	fs.StringVar(&o.mixer, "mixer", "", "volume control: wpctl, pactl or amixer (default: the first installed)")
	fs.StringVar(&o.amixerControl, "amixer-control", "Master", "ALSA control amixer sets (e.g. PCM, Speaker)")
	fs.StringVar(&o.camera, "camera", "/dev/video0", "V4L2 camera device")
	fs.StringVar(&o.capture, "capture", "", "capture tool: ffmpeg or fswebcam (default: the first installed)")
	fs.StringVar(&o.resolution, "resolution", "640x480", "photo size")
}

// agent builds the agent from the options, which apply checked; readOnly
// writes nothing in the state directory (devagent.Config.ReadOnly).
func (o *options) agent(stderr io.Writer, profile device.Profile, readOnly bool) (*devagent.Agent, *slog.Logger, error) {
	var level slog.Level
	_ = level.UnmarshalText([]byte(o.logLevel)) // apply checked it
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	a, err := devagent.New(devagent.Config{
		StateDir: o.stateDir, ID: o.id, Packs: o.packList(),
		IR:    ir.ModuleConfig{Port: o.irPort, Baud: o.irBaud, Addr: byte(o.irAddr), ExactAddr: true, Timeout: o.irTimeout},
		Mixer: o.mixer, AmixerControl: o.amixerControl,
		Camera: o.camera, Capture: o.capture, Resolution: o.resolution,
		Version: buildVersion(), Logger: log, ReadOnly: readOnly,
	}, profile)
	return a, log, err
}

// checkIRPort warns at start when the IR pack's serial port is missing: the
// IR tools say so only to their callers, so the board's log would show
// nothing of a module on another port than the default.
func (o *options) checkIRPort(log *slog.Logger) {
	if !slices.Contains(strings.Split(strings.ReplaceAll(o.packs, " ", ""), ","), "ir") {
		return
	}
	if _, err := os.Stat(o.irPort); err != nil {
		log.Warn("the IR module's serial port cannot be found: IR tools fail until it appears (set --ir-port)", "ir_port", o.irPort, "error", err)
	}
}

func newRootCmd(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	var o options
	root := &cobra.Command{
		Use:   "mcpgate-device",
		Short: "A Linux device agent: IR remote, system and camera tools for XiaoZhi gateways and MCP hosts",
		Long: `mcpgate-device serves tool packs from a Linux board:

  ir      self.ir.* - send and learn infrared remote codes through a UART IR learning module
  system  self.get_device_status, self.audio_speaker.set_volume
  camera  self.camera.take_photo (ffmpeg or fswebcam, explained by the gateway's vision service)

to an mcpgate gateway as a XiaoZhi device (run), to an MCP host over stdio (stdio), or to
an MCP endpoint such as mcpgate's /mcp/endpoint or the XiaoZhi service's (endpoint).
There is no shell or command tool, on purpose. See docs/device-agent.md.`,
		Example: `  mcpgate-device run --server ws://gw.lan:8000/xiaozhi/v1/ --ir-port /dev/ttyUSB0
  mcpgate-device run --ota http://gw.lan:8000/xiaozhi/ota/
  mcpgate-device endpoint --url 'ws://gw.lan:8000/mcp/endpoint?token=s3cret&name=livingroom'
  mcpgate-device stdio --packs ir
  mcpgate-device tools`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return o.apply(cmd)
		},
		Version: buildVersion(),
	}
	root.SetVersionTemplate("mcpgate-device {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return suggest.UnknownFlag(c.Flags(), err) })
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	o.flags(root.PersistentFlags())
	root.AddCommand(newRunCmd(&o, stderr), newStdioCmd(&o, stdin, stdout, stderr), newEndpointCmd(&o, stderr),
		newToolsCmd(&o, stdout, stderr), newVersionCmd(stdout))
	return root
}

func newRunCmd(o *options, stderr io.Writer) *cobra.Command {
	var g devagent.GatewayOptions
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Connect to a gateway as a XiaoZhi device and serve the packs, reconnecting forever",
		Long: `run connects to an mcpgate (or other XiaoZhi) gateway as a device: over WebSocket with --server, or
provisioned like firmware with --ota (the OTA answer names the WebSocket or MQTT settings and the token).
It reconnects with jittered backoff until stopped. Tool failures are isError results with the reason.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.Check(); err != nil {
				return err // before the agent makes its identity
			}
			a, log, err := o.agent(stderr, device.ProfilePyXiaozhi, false)
			if err != nil {
				return err
			}
			defer a.Close()
			log.Info("mcpgate-device starting", "device_id", a.ID(), "version", buildVersion(), "packs", o.packs,
				"ir_port", o.irPort, "state_dir", o.stateDir, "tools", len(a.Server().Tools()))
			o.checkIRPort(log)
			err = a.RunGateway(cmd.Context(), g)
			if cmd.Context().Err() != nil {
				return nil // stopped by a signal
			}
			return err
		},
	}
	cmd.Flags().StringVar(&g.Server, "server", "", "gateway WebSocket URL, e.g. ws://gw.lan:8000/xiaozhi/v1/")
	cmd.Flags().StringVar(&g.OTA, "ota", "", "gateway OTA URL, e.g. http://gw.lan:8000/xiaozhi/ota/")
	cmd.Flags().StringVar(&g.Token, "token", "", "device token for --server (env MCPGATE_DEVICE_TOKEN)")
	return cmd
}

func newStdioCmd(o *options, stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "stdio",
		Short: "Serve the packs as a standard MCP server over stdin/stdout",
		Long: `stdio is an MCP server on stdin/stdout (newline-delimited JSON-RPC), for mcpgate bridge, Claude Desktop
and other MCP hosts. Logs go to stderr.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			a, _, err := o.agent(stderr, device.ProfileSpec, false)
			if err != nil {
				return err
			}
			defer a.Close()
			err = a.ServeStdio(cmd.Context(), stdin, stdout)
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
}

func newEndpointCmd(o *options, stderr io.Writer) *cobra.Command {
	var e devagent.EndpointOptions
	cmd := &cobra.Command{
		Use:   "endpoint",
		Short: "Dial an MCP endpoint (mcpgate's /mcp/endpoint, the XiaoZhi service's) and serve the packs there",
		Long: `endpoint connects to an MCP endpoint in the XiaoZhi convention: a WebSocket on which the endpoint is the
MCP client and each text frame is one JSON-RPC message. Use mcpgate's /mcp/endpoint (add &name= to choose
the source's name) or the endpoint URL the XiaoZhi console gives, so a board's tools reach a speaker.
It reconnects with jittered backoff until stopped.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.Check(); err != nil {
				return err // before the agent makes its identity
			}
			a, log, err := o.agent(stderr, device.ProfileSpec, false)
			if err != nil {
				return err
			}
			defer a.Close()
			log.Info("mcpgate-device starting", "mode", "endpoint", "version", buildVersion(), "tools", len(a.Server().Tools()))
			o.checkIRPort(log)
			err = a.RunEndpoint(cmd.Context(), e)
			if cmd.Context().Err() != nil {
				return nil
			}
			return err
		},
	}
	cmd.Flags().StringVar(&e.URL, "url", "", "endpoint WebSocket URL with its token, e.g. 'wss://host/mcp/?token=...'")
	return cmd
}

func newToolsCmd(o *options, stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "tools",
		Short: "Print the tools the agent would serve, and exit (writing nothing in the state dir)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			a, _, err := o.agent(stderr, device.ProfileSpec, true)
			if err != nil {
				return err
			}
			defer a.Close()
			for _, t := range a.Server().Tools() {
				var props []string
				for _, p := range t.Properties {
					s := p.Name + ":" + p.Type.String()
					if p.Min != nil && p.Max != nil {
						s += fmt.Sprintf("[%d..%d]", *p.Min, *p.Max)
					}
					if !p.Required() {
						s += fmt.Sprintf("=%v", p.Default)
					}
					props = append(props, s)
				}
				desc, _, _ := strings.Cut(t.Description, "\n")
				fmt.Fprintf(stdout, "%s(%s)\n    %s\n", t.Name, strings.Join(props, ", "), desc)
			}
			return nil
		},
	}
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		// Whatever the configuration: it is what one checks first.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(stdout, "mcpgate-device", buildVersion())
			return nil
		},
	}
}

// envPrefix names every setting in the environment: MCPGATE_DEVICE_IR_PORT.
const envPrefix = "MCPGATE_DEVICE_"

// compatEnv are py-xiaozhi's names for two settings; ours win over them.
var compatEnv = map[string]string{"ir-port": "IR_SERIAL_PORT", "ir-baud": "IR_BAUD"}

// apply fills the command's flags from the environment and the config file,
// the command line winning over the environment, which wins over the file,
// and checks every value, naming where a refused one was given.
func (o *options) apply(cmd *cobra.Command) error {
	fs := cmd.Flags()
	if !fs.Changed("config") {
		if v := os.Getenv(envPrefix + "CONFIG"); v != "" {
			o.config = v
		}
	}
	if err := flagconfig.ApplyOptions(fs, flagconfig.Options{File: o.config, EnvPrefix: envPrefix, EnvAliases: compatEnv,
		Help: "this command's --help", Ignore: otherCommandsFlags(cmd), Lists: []string{"packs"}, Check: o.checkOne}); err != nil {
		return err
	}
	return locate(fs, o.check(""))
}

// otherCommandsFlags lists the flags of every mcpgate-device command, so
// that one config file with run's server: or endpoint's url: serves tools
// and stdio too.
func otherCommandsFlags(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Root().Commands() {
		c.LocalFlags().VisitAll(func(f *pflag.Flag) { names = append(names, f.Name) })
	}
	return names
}
