package cluster

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// routeUser is the user name of a route's credentials: --cluster-token is
// the shared secret, and nats-server authenticates routes by user and
// password.
const routeUser = "mcpgate"

// secure locks down the embedded server's options: its client port (there
// only because nats-server starts no routes without one) takes only the
// returned per-process token, which the in-process connection presents;
// routes need cfg.Token and, with cfg.TLSCert, mutual TLS against cfg.TLSCA.
// Secrets are never logged.
func secure(cfg Config, opts *server.Options) (clientToken string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("cluster: a client token: %w", err)
	}
	clientToken = hex.EncodeToString(b)
	opts.Authorization = clientToken

	if cfg.Token != "" {
		opts.Cluster.Username, opts.Cluster.Password = routeUser, cfg.Token
		for _, u := range opts.Routes {
			if u.User == nil {
				u.User = url.UserPassword(routeUser, cfg.Token)
			}
		}
	}
	if cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.TLSCA != "" {
		tc, err := routeTLS(cfg)
		if err != nil {
			return "", err
		}
		opts.Cluster.TLSConfig = tc
		opts.Cluster.TLSTimeout = 5
	}
	if cfg.Listen != "" && cfg.Token == "" && opts.Cluster.TLSConfig == nil && !loopback(opts.Cluster.Host) {
		cfg.Logger.Warn("cluster: routes listen beyond loopback with neither --cluster-token nor --cluster-tls-*: anyone who reaches the port joins the cluster",
			"listen", cfg.Listen)
	}
	return clientToken, nil
}

// routeTLS is mutual TLS for routes: this node's certificate, and the CA
// every other node's certificate must chain to, both ways.
func routeTLS(cfg Config) (*tls.Config, error) {
	if err := cfg.CheckSecurity(); err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("cluster: route TLS certificate: %w", err)
	}
	pem, err := os.ReadFile(cfg.TLSCA)
	if err != nil {
		return nil, fmt.Errorf("cluster: route TLS CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("cluster: route TLS CA %s: no PEM certificate in it", cfg.TLSCA)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}, nil
}

// loopback reports whether host (of a listen address) is a loopback one;
// "" and unspecified addresses listen everywhere.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckSecurity refuses route settings that cannot work, rather than let
// the node run alone: TLS files not given together, route settings with an
// operator's NATS (which routes and secures itself), routes without a
// route port (the embedded server would ignore them), credentials without
// --nats, a route not written nats://HOST:PORT.
func (c Config) CheckSecurity() error {
	if err := CheckNodeID(c.NodeID); err != nil {
		return err
	}
	tls := c.TLSCert != "" || c.TLSKey != "" || c.TLSCA != ""
	if tls && (c.TLSCert == "" || c.TLSKey == "" || c.TLSCA == "") {
		return errors.New("cluster: route TLS needs --cluster-tls-cert, --cluster-tls-key and --cluster-tls-ca together")
	}
	if len(c.NATS) > 0 && (tls || c.Token != "") {
		return errors.New("cluster: --cluster-token and --cluster-tls-* secure the embedded NATS's routes; with --nats, secure your NATS itself (--nats-creds)")
	}
	if len(c.NATS) > 0 && (c.Listen != "" || len(c.Routes) > 0) {
		return errors.New("cluster: --cluster-listen and --cluster-routes are the embedded NATS's routes; with --nats, your NATS routes the nodes")
	}
	if len(c.NATS) == 0 && len(c.Routes) > 0 && c.Listen == "" {
		return errors.New("cluster: --cluster-routes needs --cluster-listen: the embedded NATS routes only with a route port of its own (e.g. --cluster-listen 0.0.0.0:6222)")
	}
	if len(c.NATS) == 0 && c.Creds != "" {
		return errors.New("cluster: --nats-creds is for --nats")
	}
	if _, err := parseRoutes(c.Routes, tls); err != nil {
		return err
	}
	return nil
}

// loginHint names, after a --nats server refused this node's login, the
// flag that sets it and whether it was given; "" for any other error.
func loginHint(cfg Config, err error) string {
	if len(cfg.NATS) == 0 || !(errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)) {
		return ""
	}
	switch {
	case cfg.Creds != "":
		return fmt.Sprintf(" (the NATS server refused the login of --nats-creds %s: check that file)", cfg.Creds)
	case strings.Contains(strings.Join(cfg.NATS, ","), "@"):
		return " (the NATS server refused the login in the --nats URL; no --nats-creds given)"
	}
	return " (the NATS server wants a login and none was given: name its credentials file with --nats-creds)"
}
