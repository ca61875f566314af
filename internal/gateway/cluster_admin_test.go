package gateway

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/cluster"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/store"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
)

// Two gateways in cluster mode on one store: the REST door of the node that
// does not hold a device sets its alias (stored once), audits its calls with
// both nodes, forgets it (409 while online, force disconnects it on its
// holder); a key revoked on one node is refused by the other within 1s.
func TestClusterAdminAcrossGateways(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	_, admin := storeKey(t, st, "admin", auth.ScopeAdmin)
	callerID, caller := storeKey(t, st, "caller", auth.ScopeCall)
	a, b := startPair(t, Config{Store: st, RequireKeys: true}, "t")

	mac := "02:00:00:00:0d:02"
	runEchoDevice(t, a, mac)
	anon := restClient(t, b)
	onB, callerOnB := anon.WithKey(admin), anon.WithKey(caller)
	onA := restClient(t, a)
	waitEchoThrough(t, onB, mac)

	// Alias, set through b, stored once (by a, which holds the device).
	d, err := onB.SetAlias(t.Context(), mac, "porch")
	if err != nil || d.Alias != "porch" || d.Node != "a" {
		t.Fatalf("alias through the other node: %+v, %v", d, err)
	}
	if dev, err := a.Hub().Device("porch"); err != nil || dev.ID != mac {
		t.Errorf("the holder does not know the alias: %+v, %v", dev, err)
	}
	waitFor(t, "the alias in the store", 5*time.Second, func() bool {
		devs, err := st.Devices(t.Context())
		return err == nil && len(devs) == 1 && devs[0].Alias == "porch"
	})

	// The audit log names the node that took the call and the one that served it.
	waitFor(t, "the routed call's audit record", 5*time.Second, func() bool {
		page, err := onB.Audit(t.Context(), api.AuditQuery{Device: mac, Tool: "self.echo", Outcome: "ok"})
		if err != nil || len(page.Records) == 0 {
			return false
		}
		r := page.Records[0]
		return r.Node == "b" && r.ServedBy == "a"
	})

	// Forget through b: refused while online, then forced.
	var ae *api.APIError
	if _, err := onB.Forget(t.Context(), mac, false); !errors.As(err, &ae) || ae.Code != "device_online" {
		t.Fatalf("forget of a device online on another node: %v, want device_online", err)
	}
	res, err := onB.Forget(t.Context(), mac, true)
	if err != nil || !res.Disconnected || res.Device != mac {
		t.Fatalf("forced forget through the other node: %+v, %v", res, err)
	}
	// The device's client reconnects at once, as a new device (default alias).
	waitFor(t, "the holder to drop the forgotten device", 5*time.Second, func() bool {
		dev, err := a.Hub().Device(mac)
		return err != nil || dev.Alias != "porch"
	})

	// A key revoked on a is refused on b within 1s (its cache lifetime).
	if _, err := onB.Devices(t.Context()); err != nil {
		t.Fatal(err) // the admin key works on b
	}
	if _, err := callerOnB.Devices(t.Context()); err != nil {
		t.Fatal(err) // the caller key is cached on b
	}
	if _, err := onA.WithKey(admin).RevokeKey(t.Context(), callerID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	waitFor(t, "the revoked key refused on the other node", 5*time.Second, func() bool {
		_, err := callerOnB.Devices(t.Context())
		return errors.As(err, &ae) && ae.Status == 401
	})
	if d := time.Since(revoked); d > 1500*time.Millisecond {
		t.Errorf("a key revoked on node a was accepted by node b for %s, want at most 1s", d)
	}
}

// A device's credentials revoked through one node: its session on another
// node is closed, and that node refuses its old token too.
func TestClusterRevocationAcrossGateways(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	prov := Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}
	a, b := startPair(t, Config{Store: st, Provisioning: prov}, "t")
	const mac, cid = "02:00:00:00:0d:03", "client-d3"
	token, err := a.devices.auth.Authority().IssueDevice(mac, cid, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(gw *Gateway) (stop func()) {
		c, err := device.NewClient(device.ClientOptions{URL: wsURL(gw), DeviceID: mac, ClientID: cid, Token: token,
			Server: newServer(t, device.ProfileESP32), MinBackoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return runInBackground(t, c.Run)
	}
	// Node a knows the device (it was connected there); it is now on b.
	stop := dial(a)
	waitState(t, a, mac, hub.StateReady)
	stop()
	waitState(t, a, mac, hub.StateOffline)
	dial(b)
	waitState(t, b, mac, hub.StateReady)
	// a reaches it once it knows b holds it (the view; b's subscription
	// reaches a's NATS server before b's message saying so).
	waitFor(t, "a to see the device on b", 5*time.Second, func() bool {
		d, err := a.Hub().Device(mac)
		return err == nil && d.Online && d.Node == "b"
	})

	res, err := restClient(t, a).RevokeTokens(t.Context(), mac)
	if err != nil || !res.Disconnected {
		t.Fatalf("revoke through the node not holding the device: %+v, %v", res, err)
	}
	// The device retries b with its old token: refused there too.
	waitFor(t, "a refused reconnect on b", 5*time.Second, func() bool {
		return strings.Contains(scrape(t, b), `mcpgate_device_auth_failures_total{reason="revoked",transport="websocket"}`)
	})
	if d, _ := b.Hub().Device(mac); d.Online {
		t.Fatal("device back online on another node with a revoked token")
	}
}

// TestClusterSecretMismatchLeaves: a node joining with another device
// secret than a live node's leaves the cluster (it would refuse the tokens
// the other issues), and the live node stays; a node with the same secret
// joins.
func TestClusterSecretMismatchLeaves(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	beat := &cluster.Config{Heartbeat: 200 * time.Millisecond}
	prov := Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret}
	a := startGateway(t, asNode(t, Config{Store: st, Provisioning: prov, Cluster: beat}, "sm", "a"))

	other := prov
	other.DeviceSecret = []byte("another-secret-another-secret-another")
	b, err := New(asNode(t, Config{Addr: "127.0.0.1:0", Store: st, Provisioning: other, Cluster: beat}, "sm", "b", a.ClusterRoute()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = b.Run(ctx)
	if !errors.Is(err, cluster.ErrSecretMismatch) || !strings.Contains(err.Error(), "--device-secret-file") {
		t.Fatalf("a node with another device secret: %v, want ErrSecretMismatch naming --device-secret-file", err)
	}
	if _, err := restClient(t, a).Devices(t.Context()); err != nil {
		t.Fatalf("the live node after the other left: %v", err)
	}

	c := startGateway(t, asNode(t, Config{Store: st, Provisioning: prov, Cluster: beat}, "sm", "c", a.ClusterRoute()))
	waitFor(t, "the node with the same secret to be a member", 5*time.Second, func() bool {
		return len(c.cluster.node.Load().Members()) == 2
	})
	select {
	case err := <-c.clusterFatal():
		t.Fatalf("a node with the same secret left: %v", err)
	case <-time.After(time.Second):
	}
}

// TestClusterSharesDeviceSecret: with the secret in the store, nodes with
// secret files of their own (or none) sign with the first node's, so a
// token one node issues opens a session on the other.
func TestClusterSharesDeviceSecret(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	prov := Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: testSecret, SecretInStore: true}
	other := prov
	other.DeviceSecret = nil
	a := startGateway(t, asNode(t, Config{Store: st, Provisioning: prov}, "ss", "a"))
	b := startGateway(t, asNode(t, Config{Store: st, Provisioning: other}, "ss", "b", a.ClusterRoute()))

	const mac, cid = "02:00:00:00:0d:05", "client-d5"
	token, err := a.devices.auth.Authority().IssueDevice(mac, cid, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.devices.auth.Authority().Verify(mac, cid, token); err != nil {
		t.Fatalf("a token node a issued, on node b: %v", err)
	}
	if a.devices.auth.Authority().Mark() != devauth.SecretMark(testSecret) {
		t.Error("the first node does not sign with its own secret, which it put in the store")
	}
	v, err := st.Setting(t.Context(), SecretSetting)
	if err != nil || strings.Contains(v, string(testSecret)) {
		t.Errorf("the store's secret: %q, %v; want it hex encoded", v, err)
	}
}

// TestClusterSharedVisionDir: nodes sharing a photo directory each list
// and serve the photos a device uploaded to another.
func TestClusterSharedVisionDir(t *testing.T) {
	st := storetest.Open(t, "", t.TempDir())
	prov := Provisioning{SecretInStore: true, VisionDir: t.TempDir()}
	a, b := startPair(t, Config{Store: st, Provisioning: prov}, "vd")
	const mac = "02:00:00:00:0d:06"
	runEchoDevice(t, a, mac)
	token, err := a.devices.auth.Authority().IssueVision(mac, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if status, body := upload(t, "http://"+a.Addr(), mac, token); status != http.StatusOK {
		t.Fatalf("upload to node a: %d %s", status, body)
	}
	var list struct {
		Photos []struct{ ID string }
	}
	waitFor(t, "node b to list the photo", 5*time.Second, func() bool {
		status, body := get(t, "http://"+b.Addr()+"/api/v1/devices/"+mac+"/photos")
		return status == http.StatusOK && json.Unmarshal([]byte(body), &list) == nil && len(list.Photos) == 1
	})
	if status, body := get(t, "http://"+b.Addr()+"/api/v1/devices/"+mac+"/photos/"+list.Photos[0].ID); status != http.StatusOK || !strings.Contains(body, "not really a photo") {
		t.Errorf("the photo through node b: %d %.80q", status, body)
	}
}

// get sends GET url with no key and returns the answer's status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	return send(t, req)
}

// TestAloneKeepsFormerClusterSecret: a gateway alone on the store of a
// former cluster signs with the cluster's secret (its devices' tokens still
// verify), and one on a store holding none signs with its own file's,
// writing nothing to the store.
func TestAloneKeepsFormerClusterSecret(t *testing.T) {
	clusterSecret := []byte("the-cluster-secret-the-cluster-secret")
	st := storetest.Open(t, "", t.TempDir())
	if err := st.SetSetting(t.Context(), SecretSetting, hex.EncodeToString(clusterSecret)); err != nil {
		t.Fatal(err)
	}
	gw := startGateway(t, Config{Store: st, Provisioning: Provisioning{DeviceSecret: testSecret, SecretInStore: true}})
	if got := gw.devices.auth.Authority().Mark(); got != devauth.SecretMark(clusterSecret) {
		t.Error("a gateway alone on a former cluster's store does not sign with the cluster's secret")
	}

	fresh := storetest.Open(t, "", t.TempDir())
	gw = startGateway(t, Config{Store: fresh, Provisioning: Provisioning{DeviceSecret: testSecret, SecretInStore: true}})
	if got := gw.devices.auth.Authority().Mark(); got != devauth.SecretMark(testSecret) {
		t.Error("a gateway alone on a store with no secret does not sign with its own")
	}
	if _, err := fresh.Setting(t.Context(), SecretSetting); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a gateway alone wrote its secret to the store: %v", err)
	}
}
