package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/flagconfig"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/mcpclient"
	"github.com/mcpgate/mcpgate/internal/store"
)

func newServeCmd(g *globals) *cobra.Command {
	var (
		cfg          gateway.Config
		configFile   string
		logLevel     string
		logFormat    string
		toolTimeouts map[string]string
		mqttCert     string
		mqttKey      string
	)
	var applyProvisioning func(*slog.Logger) error // fills cfg.Provisioning once flags are parsed
	var applyLLM func() error                      // fills cfg.LLM (the device agent) once flags are parsed
	var applyQueue func() error                    // fills cfg.Queue.Tools once flags are parsed
	var mqttNode string                            // INDEX/COUNT
	var auditRetention string                      // an age: 30d, 720h, 0
	var clusterCfg cluster.Config                  // cluster mode when Name or NATS is set
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway",
		Long: `Run the gateway: devices connect to ws://ADDR/xiaozhi/v1/, clients use
http://ADDR/api/v1. Every flag can also be set as MCPGATE_<FLAG> in the
environment (e.g. MCPGATE_ADDR=0.0.0.0:8000) or as a key of the YAML file
given with --config (e.g. "addr: 0.0.0.0:8000"). Flags win over the
environment, which wins over the file.`,
		Example: `  mcpgate serve
  mcpgate serve --addr 0.0.0.0:8000 --call-timeout 45s --tool-timeout 'self.camera.*=120s'
  mcpgate serve --config mcpgate.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			// A refused value from the file or the environment is named
			// as it was given there.
			defer func() { err = locate(cmd.Flags(), err) }()
			if v, ok := os.LookupEnv("MCPGATE_CONFIG"); ok && !cmd.Flags().Changed(flagconfig.ConfigFlag) {
				configFile = v // as every flag is also MCPGATE_<FLAG>
			}
			if err := flagconfig.ApplyOptions(cmd.Flags(), flagconfig.Options{File: configFile, EnvPrefix: "MCPGATE_", Help: "'mcpgate serve --help'",
				Check: func(name string) error { return checkValue(cfg, logLevel, logFormat, name) }}); err != nil {
				return err
			}
			if cfg.DataDir, err = resolveDataDir(cmd.Flags()); err != nil {
				return err
			}
			logger, err := newLogger(g.stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			if !cmd.Flags().Changed("data") {
				if _, err := os.Stat(filepath.Join(cfg.DataDir, store.DefaultFile)); err != nil {
					if hint := legacyHint(cfg.StoreDSN, true); hint != "" {
						logger.Warn(hint + " (this gateway starts a new store in " + cfg.DataDir + ")")
					}
				}
			}
			cfg.Version = buildVersion()
			if err := checkNumbers(&cfg, ""); err != nil {
				return err
			}
			if err := checkAuthFlags(&cfg); err != nil {
				return err
			}
			var gw *gateway.Gateway
			defer func() {
				// A device secret made at this start is the store's only once
				// the gateway served (its check of the store passed, and tokens
				// may be signed with it), and unless that check found the
				// store's tokens signed with another (open mode serves
				// anyway): else it goes again, or the next start would take it
				// for the store's (gateway.ErrSecretLost).
				made := cfg.Provisioning.NewSecretFile
				served := gw != nil && isClosed(gw.Ready())
				if made == "" || (err == nil || served) && !(gw != nil && gw.NewSecretUnwanted()) {
					return
				}
				if rerr := os.Remove(made); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
					logger.Error("removing the device secret made at this start", "error", rerr)
				}
			}()
			if err := applyProvisioning(logger); err != nil {
				return err
			}
			if err := applyLLM(); err != nil {
				return err
			}
			if len(toolTimeouts) > 0 {
				cfg.ToolTimeouts = map[string]time.Duration{"self.camera.*": 90 * time.Second}
				for pattern, v := range toolTimeouts {
					d, err := time.ParseDuration(v)
					if err != nil || d <= 0 {
						return entryErrorf("tool-timeout", pattern, "%s=%s: want a positive duration such as 90s", pattern, v)
					}
					cfg.ToolTimeouts[pattern] = d
				}
			}
			switch {
			case mqttCert != "" && mqttKey == "":
				return flagErrorf("mqtt-tls-cert", "needs --mqtt-tls-key: the two go together")
			case mqttKey != "" && mqttCert == "":
				return flagErrorf("mqtt-tls-key", "needs --mqtt-tls-cert: the two go together")
			}
			if mqttCert != "" {
				// It secures the embedded broker's listener: without one
				// it would be ignored.
				switch {
				case cfg.MQTTBroker != "":
					return flagErrorf("mqtt-tls-cert", "%s: not with --mqtt-broker: it secures the embedded broker, which is not started with an external one (use an ssl:// or mqtts:// broker URL)", mqttCert)
				case cfg.MQTTAddr == "":
					return flagErrorf("mqtt-tls-cert", "%s: needs --mqtt-addr: the embedded broker is disabled (--mqtt-addr \"\")", mqttCert)
				}
				if cfg.MQTTTLS, err = mqttTLS(logger, mqttCert, mqttKey, time.Now()); err != nil {
					return err
				}
			}
			if cfg.MQTTBroker != "" {
				if cmd.Flags().Changed("mqtt-addr") && cfg.MQTTAddr != "" {
					return flagErrorf("mqtt-addr", "%s: not with --mqtt-broker: the embedded broker is not started with an external one", cfg.MQTTAddr)
				}
				cfg.MQTTAddr = ""
			}
			if mqttNode != "" {
				if cfg.MQTTBroker == "" {
					return flagErrorf("mqtt-node", "needs --mqtt-broker: it splits devices among gateway nodes sharing an external broker")
				}
				var err error
				if cfg.MQTTNode, cfg.MQTTNodes, err = parseMQTTNode(mqttNode); err != nil {
					return err
				}
			}
			if err := applyAuditFlags(&cfg, auditRetention); err != nil {
				return err
			}
			if err := applyQueue(); err != nil {
				return err
			}
			if clusterCfg.Name == "" {
				// Without a name they would be ignored, and the node run alone.
				for _, f := range []struct {
					flag string
					set  bool
				}{{"nats", len(clusterCfg.NATS) > 0}, {"cluster-listen", clusterCfg.Listen != ""}, {"cluster-routes", len(clusterCfg.Routes) > 0},
					{"cluster-token", clusterCfg.Token != ""}, {"nats-creds", clusterCfg.Creds != ""}, {"cluster-tls-cert", clusterCfg.TLSCert != ""},
					{"cluster-tls-key", clusterCfg.TLSKey != ""}, {"cluster-tls-ca", clusterCfg.TLSCA != ""}, {"node-id", clusterCfg.NodeID != ""}} {
					if f.set {
						return flagErrorf(f.flag, "needs --cluster-name: the nodes of one cluster share a name (docs/cluster.md)")
					}
				}
			} else {
				c := clusterCfg
				cfg.Cluster = &c
			}
			if gw, err = gateway.New(cfg); err != nil {
				return err
			}
			err = gw.Run(cmd.Context())
			if err != nil && cmd.Context().Err() != nil && errors.Is(err, context.Canceled) {
				// Stopped (SIGTERM...) while still starting, waiting for a
				// broker or a store: asked for, not a failure.
				logger.Info("gateway stopped before it was ready: asked to stop while starting", "during", err.Error())
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML config file whose keys are these flag names (env MCPGATE_CONFIG)")
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:8000", "HTTP listen address for devices and clients (port 0 picks a free one)")
	f.StringVar(&cfg.DataDir, "data", defaultDataDir(os.Getenv, os.Geteuid()), "directory for the gateway's files: the SQLite store, the device secret, photos (not empty, not a file such as mcpgate.db)")
	f.StringVar(&cfg.StoreDSN, "store", "", "the store: empty for SQLite at DATA/mcpgate.db, sqlite:PATH, or postgres://USER:PASSWORD@HOST:PORT/DB (a new store starts empty: nothing is copied from DATA/mcpgate.db)")
	f.StringVar(&clusterCfg.Name, "cluster-name", "", "cluster mode (docs/cluster.md): the cluster's name, the same on every node; needs --store postgres://...")
	f.StringVar(&clusterCfg.Listen, "cluster-listen", "", "cluster mode, embedded NATS: where this node's routes listen, e.g. 0.0.0.0:6222")
	f.StringSliceVar(&clusterCfg.Routes, "cluster-routes", nil, "cluster mode, embedded NATS: the other nodes' routes, each nats://HOST:PORT, e.g. nats://n2:6222,nats://n3:6222")
	f.StringSliceVar(&clusterCfg.NATS, "nats", nil, "cluster mode on your own NATS instead of an embedded server: its URLs, e.g. nats://a:4222,nats://b:4222")
	f.StringVar(&clusterCfg.Creds, "nats-creds", "", "credentials file for --nats")
	f.StringVar(&clusterCfg.NodeID, "node-id", "", "this node's id in the cluster (default: the host name)")
	f.StringVar(&clusterCfg.Token, "cluster-token", "", "cluster mode, embedded NATS: the routes' shared secret, the same on every node (prefer MCPGATE_CLUSTER_TOKEN: flags show in ps)")
	f.StringVar(&clusterCfg.TLSCert, "cluster-tls-cert", "", "cluster mode, embedded NATS: this node's certificate (PEM) for mutual TLS on routes")
	f.StringVar(&clusterCfg.TLSKey, "cluster-tls-key", "", "cluster mode, embedded NATS: the key of --cluster-tls-cert (PEM)")
	f.StringVar(&clusterCfg.TLSCA, "cluster-tls-ca", "", "cluster mode, embedded NATS: the CA (PEM) every node's route certificate must chain to")
	f.DurationVar(&cfg.CallTimeout, "call-timeout", 30*time.Second, "default timeout of a tool call")
	f.StringToStringVar(&toolTimeouts, "tool-timeout", map[string]string{"self.camera.*": "90s"},
		"per-tool call timeouts as PATTERN=DURATION (path.Match patterns; the longest matching pattern wins); self.camera.*=90s stays unless that pattern is given")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", 10*time.Second, "timeout of initialize and of each tools/list page")
	f.IntVar(&cfg.MaxPages, "max-pages", 50, "most tools/list pages read per discovery")
	f.IntVar(&cfg.MaxTools, "max-tools", 1000, "most tools kept per device")
	f.IntVar(&cfg.MaxCatalogBytes, "max-catalog-bytes", mcpclient.DefaultMaxCatalogBytes, "most bytes of tools kept per device, as it lists them")
	f.DurationVar(&cfg.HelloTimeout, "hello-timeout", 10*time.Second, "how long a device has to send its hello; with --upstream, the voice server has as long to connect and answer it")
	f.Int64Var(&cfg.ReadLimit, "read-limit", 1<<20, "largest device frame (WebSocket) or packet (embedded MQTT broker; an external broker limits its own) accepted, in bytes")
	limitFlags(f, &cfg.Limits)
	f.DurationVar(&cfg.PingInterval, "ping-interval", 30*time.Second, "WebSocket keepalive ping interval (negative disables)")
	f.BoolVar(&cfg.ExposeUserOnly, "expose-user-only", false, "list user-only device tools (annotations.audience [\"user\"]) on the MCP doors")
	f.StringSliceVar(&cfg.AllowedHosts, "allowed-hosts", nil, "extra Host header values REST and MCP accept on loopback (DNS-rebinding guard), e.g. gateway.lan:8000")
	f.DurationVar(&cfg.PongTimeout, "pong-timeout", 0, "how long a device has to answer a keepalive ping (0 = the ping interval)")
	f.StringSliceVar(&cfg.AllowedOrigins, "allowed-origins", nil, "browser origins allowed on every door besides loopback and same-origin, e.g. https://app.example.com or '*.example.com'")
	f.BoolVar(&cfg.RequireKeys, "require-keys", false, "require an API key on REST and MCP on a loopback address too, as behind a reverse proxy (always required on other addresses unless --insecure)")
	f.BoolVar(&cfg.OAuth, "oauth", false, "let MCP clients that accept only OAuth connect: they are granted an API key on an admin's consent in the web console (needs keys required)")
	f.BoolVar(&cfg.Insecure, "insecure", false, "leave REST and MCP open without API keys on a non-loopback address, or on loopback to requests through a reverse proxy (anyone who reaches it can list and call every device)")
	f.StringArrayVar(&cfg.EndpointTokens, "endpoint-token", nil, "token MCP servers present at /mcp/endpoint (repeatable; none: only when listening on loopback)")
	f.StringVar(&cfg.DebugAddr, "pprof-addr", "", "serve Go pprof profiles on this address, e.g. 127.0.0.1:6060 (off when empty)")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long pending calls may finish on stop")
	f.StringVar(&auditRetention, "audit-retention", "30d", "delete audit records older than this, e.g. 90d or 720h (0 keeps them forever)")
	f.IntVar(&cfg.AuditMaxRows, "audit-max-rows", 1_000_000, "keep at most this many audit records, deleting the oldest (0: no limit)")
	f.IntVar(&cfg.AuditMaxValueBytes, "audit-max-value", 1024, "argument values larger than this many bytes are kept in the audit log as a SHA-256 digest")
	f.StringVar(&cfg.MQTTAddr, "mqtt-addr", "127.0.0.1:1883", "embedded MQTT broker address for devices (empty disables it)")
	f.StringVar(&mqttCert, "mqtt-tls-cert", "", "PEM certificate file: the embedded MQTT broker's listener then speaks TLS (with --mqtt-tls-key); firmware uses TLS only on port 8883; read at start only")
	f.StringVar(&mqttKey, "mqtt-tls-key", "", "PEM private key file of --mqtt-tls-cert")
	f.StringVar(&cfg.MQTTUplinkTopic, "mqtt-uplink-topic", "device-server", "topic MQTT devices publish to (with --mqtt-broker: the prefix of <topic>/<mac_with_underscores>)")
	f.StringVar(&cfg.MQTTBroker, "mqtt-broker", "", "external MQTT broker URL (tcp://host:port, ssl:// or mqtts:// for TLS); replaces the embedded broker")
	f.StringVar(&cfg.MQTTBrokerUsername, "mqtt-broker-username", "", "the gateway's username on --mqtt-broker")
	f.StringVar(&cfg.MQTTBrokerPassword, "mqtt-broker-password", "", "the gateway's password on --mqtt-broker")
	f.StringVar(&mqttNode, "mqtt-node", "", "with --mqtt-broker: this node's share INDEX/COUNT of the fleet, split by device id on any broker (e.g. 0/2, 1/2) instead of a shared subscription")
	f.StringVar(&cfg.MQTTShareGroup, "mqtt-share-group", "mcpgate", "shared-subscription group the gateway nodes of --mqtt-broker join")
	f.DurationVar(&cfg.MQTTSilenceTimeout, "mqtt-silence-timeout", 5*time.Minute, "with --mqtt-broker: a device silent this long is pinged, and offline if it does not answer")
	f.StringVar(&cfg.Upstream, "upstream", "", "splice every device to this XiaoZhi voice server, e.g. ws://voice-server:8000/xiaozhi/v1/ (docs/upstream.md)")
	f.StringVar(&cfg.UpstreamOTA, "upstream-ota", "", "forward /xiaozhi/ota/ to this voice server OTA URL, e.g. http://voice-server:8002/xiaozhi/ota/, with websocket.url rewritten to this gateway")
	f.DurationVar(&cfg.UpstreamInitWait, "upstream-init-wait", 3*time.Second, "with --upstream: how long to wait for the voice server's MCP initialize before mcpgate initializes the device itself")
	applyProvisioning = provisioningFlags(f, &cfg.Provisioning, &cfg.DataDir)
	applyLLM = llmFlags(f, &cfg.LLM)
	applyQueue = queueFlags(f, &cfg.Queue)
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

func newLogger(w interface{ Write([]byte) (int, error) }, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, flagErrorf("log-level", "%q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, flagErrorf("log-format", "%q: want text or json", format)
}

// certWarnBefore is how long before its expiry a certificate is warned of at start.
const certWarnBefore = 14 * 24 * time.Hour

// mqttTLS loads the MQTT listener's certificate, and warns when it has
// expired or expires within certWarnBefore: it is read once, at start, so
// a renewed file takes a restart.
func mqttTLS(log *slog.Logger, certFile, keyFile string, now time.Time) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("MQTT TLS certificate: %w", err)
	}
	leaf := pair.Leaf // set by LoadX509KeyPair (Go 1.23 and later)
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("MQTT TLS certificate %s: %w", certFile, err)
		}
	}
	switch left := leaf.NotAfter.Sub(now); {
	case left <= 0:
		log.Warn("the MQTT TLS certificate has expired: devices will refuse the TLS handshake; renew it and restart",
			"file", certFile, "not_after", leaf.NotAfter)
	case left < certWarnBefore:
		log.Warn("the MQTT TLS certificate expires soon: renew it and restart (it is read at start only)",
			"file", certFile, "not_after", leaf.NotAfter, "expires_in", left.Round(time.Minute))
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// parseMQTTNode reads --mqtt-node INDEX/COUNT, whole: a typo must not
// quietly change the fleet's split.
func parseMQTTNode(s string) (index, count int, err error) {
	i, c, ok := strings.Cut(s, "/")
	if ok {
		index, err = strconv.Atoi(i)
		if err == nil {
			count, err = strconv.Atoi(c)
		}
	}
	if !ok || err != nil || count < 1 || index < 0 || index >= count {
		return 0, 0, flagErrorf("mqtt-node", "%q: want INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/2 and 1/2 for two nodes", s)
	}
	return index, count, nil
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
