package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/api"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/devauth"
	"github.com/mcpgate/mcpgate/internal/hostiletest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/internal/mcptest"
	"github.com/mcpgate/mcpgate/internal/ota"
	"github.com/mcpgate/mcpgate/internal/store/storetest"
	"github.com/mcpgate/mcpgate/internal/vision"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// secretSet collects every secret a test presents, with what part of it
// must never show in a log.
type secretSet struct {
	mu   sync.Mutex
	list []secretEntry
}

type secretEntry struct {
	name string
	// whole is the string as presented; random is its unguessable part,
	// checked piece by piece (a log line holding a truncated secret leaks
	// it too). For an API key the id is public and only the part after it
	// counts.
	whole, random string
}

func (s *secretSet) add(name, whole string) string {
	random := whole
	if _, err := auth.ParseSecret(whole); err == nil {
		random = whole[len(auth.SecretPrefix)+auth.IDLen+1:]
	}
	s.mu.Lock()
	s.list = append(s.list, secretEntry{name: name, whole: whole, random: random})
	s.mu.Unlock()
	return whole
}

// window is the length of the pieces checked: long enough that random
// text does not match by chance, short enough to catch a secret logged
// truncated (a token's first characters, a key's last ones).
const window = 16

// check fails the test for every secret found in text, whole or as any
// window-long piece of its random part.
func (s *secretSet) check(t *testing.T, where, text string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.list {
		if i := strings.Index(text, e.whole); i >= 0 {
			t.Errorf("%s holds the %s: %s", where, e.name, lineAt(text, i))
			continue
		}
		for j := 0; j+window <= len(e.random); j++ {
			if i := strings.Index(text, e.random[j:j+window]); i >= 0 {
				t.Errorf("%s holds part of the %s: %s", where, e.name, lineAt(text, i))
				break
			}
		}
	}
}

// lineAt returns the line of text around byte i.
func lineAt(text string, i int) string {
	start := strings.LastIndexByte(text[:i], '\n') + 1
	end := strings.IndexByte(text[i:], '\n')
	if end < 0 {
		return text[start:]
	}
	return text[start : i+end]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestSecretsNeverLogged runs a gateway logging at debug level, with keys
// required, endpoint tokens, device tokens required and the embedded MQTT
// broker, and authenticates through every door with good and bad
// credentials of every kind: API keys (REST and /mcp), endpoint tokens
// (?token= and bearer), device tokens (WebSocket header and query, MQTT
// password, from OTA and issued), vision tokens. No secret, whole or in
// part, may appear in the log, nor in a refusal's body.
func TestSecretsNeverLogged(t *testing.T) {
	var logs hostiletest.Logs
	var secrets secretSet

	st := storetest.Open(t, "", t.TempDir()) // closed after the gateway stops: its cleanup is registered first
	newKey := func(name string) (id, secret string) {
		id, secret = storeKey(t, st, name, auth.ScopeAdmin)
		return id, secrets.add("API key "+name, secret)
	}
	adminID, admin := newKey("admin")
	// The admin key's id with another secret: the failure a log line is
	// most tempted to explain.
	_, other := auth.NewSecret()
	wrongSecret := secrets.add("wrong secret of a known key id",
		auth.SecretPrefix+adminID+"_"+other[len(auth.SecretPrefix)+auth.IDLen+1:])
	_, unknownKey := auth.NewSecret()
	secrets.add("unknown API key", unknownKey)
	revokedID, revoked := newKey("revoked")
	if err := st.RevokeKey(t.Context(), revokedID, time.Now()); err != nil {
		t.Fatal(err)
	}

	endpointToken := secrets.add("endpoint token", "ept-"+randomHex(16))
	wrongEndpointToken := secrets.add("wrong endpoint token", "ept-"+randomHex(16))
	deviceSecret := []byte(secrets.add("device secret", randomHex(32)))

	gw := startGateway(t, Config{
		Logger: logs.Logger(), Store: st, RequireKeys: true, EndpointTokens: []string{endpointToken},
		MQTTAddr: "127.0.0.1:0",
		Provisioning: Provisioning{DeviceAuth: devauth.ModeToken, DeviceSecret: deviceSecret,
			OTA: ota.Config{Transport: ota.TransportWebSocket}},
	})
	base := "http://" + gw.Addr()
	authority := gw.devices.auth.Authority()
	forger, err := devauth.New(devauth.Config{Secret: []byte(randomHex(32))})
	if err != nil {
		t.Fatal(err)
	}

	// Devices first, so that REST, MCP and vision have something to reach.
	const macOTA, macQuery, macMQTT = "02:00:00:50:00:01", "02:00:00:50:00:02", "02:00:00:50:00:03"
	const cidOTA, cidQuery = "00000000-0000-4000-8000-000000500001", "00000000-0000-4000-8000-000000500002"
	var mu sync.Mutex
	level := 0

	{ // device token from OTA, bearer header
		reply, err := askOTA(t, gw, macOTA, cidOTA)
		if err != nil || reply.WebSocket == nil || reply.WebSocket.Token == "" {
			t.Fatalf("OTA reply %+v: %v", reply, err)
		}
		tok := secrets.add("device token from OTA", reply.WebSocket.Token)
		runClient(t, wsURL(gw), macOTA, cidOTA, tok, newServer(t, device.ProfileESP32, volumeTool(&level, &mu)))
		waitState(t, gw, macOTA, hub.StateReady)
	}
	var queryServer *device.Server
	{ // device token in the authorization query parameter
		tok, err := authority.IssueDevice(macQuery, cidQuery, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		secrets.add("device token (query)", tok)
		queryServer = newServer(t, device.ProfileESP32)
		u := wsURL(gw) + "?" + url.Values{xiaozhi.QueryAuthorization: {"Bearer " + tok}}.Encode()
		runClient(t, u, macQuery, cidQuery, "", queryServer)
		waitState(t, gw, macQuery, hub.StateReady)
	}
	{ // refused device tokens over WebSocket
		good, _ := authority.IssueDevice(macQuery, cidQuery, time.Hour)
		secrets.add("device token (issued)", good)
		forged, _ := forger.IssueDevice(macQuery, cidQuery, time.Hour)
		otherDev, _ := authority.IssueDevice("02:00:00:50:00:09", cidQuery, time.Hour)
		for name, tok := range map[string]string{
			"forged":         forged,
			"mutated":        good[:len(good)-4] + flip(good[len(good)-4:]),
			"other device's": otherDev,
			"garbage":        "mgd1." + randomHex(24),
		} {
			tok = secrets.add(name+" device token", tok)
			for _, inQuery := range []bool{false, true} {
				u, h := wsURL(gw), http.Header{xiaozhi.HeaderDeviceID: {macQuery}, xiaozhi.HeaderClientID: {cidQuery}}
				if inQuery {
					u += "?" + url.Values{xiaozhi.QueryAuthorization: {tok}}.Encode()
				} else {
					h.Set("Authorization", "Bearer "+tok)
				}
				status, body := dialWS(t, u, h)
				if status != http.StatusUnauthorized {
					t.Fatalf("%s token (query %v): %d, want 401", name, inQuery, status)
				}
				secrets.check(t, "a WebSocket refusal", body)
			}
		}
	}
	{ // device token as MQTT password
		cid := xiaozhi.MQTTClientID{Group: "test", DeviceID: macMQTT, UUID: "6f1d9e52-0000-4000-8000-000000500003"}.String()
		_, uuid, err := devauth.ParseMQTTClientID(cid)
		if err != nil {
			t.Fatal(err)
		}
		forged, _ := forger.IssueDevice(macMQTT, uuid, time.Hour)
		secrets.add("forged MQTT password", forged)
		refuseMQTT(t, device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: macMQTT, ClientID: cid,
			Username: macMQTT, Password: forged, Server: newServer(t, device.ProfileESP32), ConnectTimeout: 10 * time.Second},
			"a forged MQTT password connected")
		good, _ := authority.IssueDevice(macMQTT, uuid, time.Hour)
		secrets.add("MQTT password", good)
		c, err := device.NewMQTTClient(device.MQTTClientOptions{Broker: gw.MQTTAddr(), DeviceID: macMQTT, ClientID: cid,
			Username: macMQTT, Password: good, Server: newServer(t, device.ProfileESP32),
			MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		runInBackground(t, c.Run)
		waitState(t, gw, macMQTT, hub.StateReady)
	}
	{ // vision tokens
		v := queryServer.Vision() // handed out in initialize
		if v.Token == "" {
			t.Fatal("the device got no vision token in initialize")
		}
		good := secrets.add("vision token from initialize", v.Token)
		if status, body := upload(t, base, macQuery, good); status != http.StatusOK {
			t.Fatalf("upload with the session's vision token: %d %s", status, body)
		}
		otherDev, _ := authority.IssueVision("02:00:00:50:00:09", time.Hour)
		deviceTok, _ := authority.IssueDevice(macQuery, "", time.Hour)
		for name, tok := range map[string]string{
			"mutated vision token":      good[:len(good)-4] + flip(good[len(good)-4:]),
			"other device's vision tok": otherDev,
			"device token as vision":    deviceTok,
		} {
			tok = secrets.add(name, tok)
			status, body := upload(t, base, macQuery, tok)
			if status != http.StatusUnauthorized && status != http.StatusForbidden {
				t.Fatalf("%s: %d, want 401 or 403", name, status)
			}
			secrets.check(t, "a vision refusal", body)
		}
	}

	{ // API keys at REST
		call := `{"name":"self.audio_speaker.set_volume","arguments":{"volume":7}}`
		if status, body := rest(t, base, admin, "GET", "/api/v1/devices", ""); status != 200 {
			t.Fatalf("list with the admin key: %d %s", status, body)
		}
		if status, body := rest(t, base, admin, "POST", "/api/v1/devices/"+macOTA+"/tools/call", call); status != 200 {
			t.Fatalf("call with the admin key: %d %s", status, body)
		}
		for name, key := range map[string]string{
			"wrong secret": wrongSecret, "unknown key": unknownKey, "revoked key": revoked,
			"endpoint token as key": endpointToken, "device secret as key": string(deviceSecret),
		} {
			status, body := rest(t, base, key, "POST", "/api/v1/devices/"+macOTA+"/tools/call", call)
			if status != http.StatusUnauthorized {
				t.Fatalf("%s: %d %s, want 401", name, status, body)
			}
			secrets.check(t, "a REST refusal", body)
		}
		// A key created and revoked through REST: its secret is in the
		// answer, and nowhere else (logs, audit records).
		status, body := rest(t, base, admin, "POST", "/api/v1/keys", `{"name":"made-over-rest","scope":"read"}`)
		var made api.Key
		if err := json.Unmarshal([]byte(body), &made); status != http.StatusCreated || err != nil || made.Secret == "" {
			t.Fatalf("create a key over REST: %d %s", status, body)
		}
		secrets.add("API key made over REST", made.Secret)
		if status, body := rest(t, base, made.Secret, "GET", "/api/v1/devices", ""); status != 200 {
			t.Fatalf("list with the key made over REST: %d %s", status, body)
		}
		if status, body := rest(t, base, admin, "DELETE", "/api/v1/keys/"+made.ID, ""); status != 200 {
			t.Fatalf("revoke the key made over REST: %d %s", status, body)
		}
		if status, body := rest(t, base, admin, "GET", "/api/v1/audit", ""); status != 200 {
			t.Fatalf("audit: %d %s", status, body)
		} else {
			secrets.check(t, "the audit log", body)
		}
	}
	{ // API keys at /mcp
		cs, err := mcpSession(t, base+"/mcp", admin)
		if err != nil {
			t.Fatalf("/mcp with the admin key: %v", err)
		}
		if _, err := cs.ListTools(t.Context(), nil); err != nil {
			t.Fatal(err)
		}
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_devices"})
		if err != nil || res.IsError {
			t.Fatalf("list_devices: %+v %v", res, err)
		}
		for name, key := range map[string]string{"wrong secret": wrongSecret, "revoked key": revoked} {
			if _, err := mcpSession(t, base+"/mcp", key); err == nil {
				t.Fatalf("/mcp with the %s connected", name)
			}
		}
	}
	{ // endpoint tokens and keys at /mcp/endpoint
		for _, c := range []struct {
			name, token string
			inQuery     bool
			want        int
		}{
			{"tokq", endpointToken, true, 101},
			{"tokh", endpointToken, false, 101},
			{"keyq", admin, true, 101},
			{"keyh", admin, false, 101},
			{"badq", wrongEndpointToken, true, 401},
			{"badh", wrongEndpointToken, false, 401},
			{"wrongkeyq", wrongSecret, true, 401},
			{"wrongkeyh", wrongSecret, false, 401},
			{"revokedq", revoked, true, 401},
		} {
			status, body := dialSource(t, base, c.name, c.token, c.inQuery)
			if status != c.want {
				t.Fatalf("%s: %d %s, want %d", c.name, status, body, c.want)
			}
			secrets.check(t, "an endpoint refusal", body)
			if status == 101 {
				waitState(t, gw, "endpoint-"+c.name, hub.StateReady)
			}
		}
	}

	// The refusals were logged (so the capture works and the failure
	// paths ran), and nothing logged holds a secret.
	text := logs.String()
	for _, want := range [][]string{
		{"request refused: unauthorized", "reason=invalid"},
		{"request refused: unauthorized", "reason=revoked"},
		{"refused MCP endpoint connection"},
		{"device authentication failed", "transport=websocket"},
		{"device authentication failed", "transport=mqtt"},
		{"device authentication failed", "transport=vision"},
		{"level=DEBUG"},
	} {
		if logs.Count(0, want...) == 0 {
			t.Errorf("no log line with %q", want)
		}
	}
	secrets.check(t, "the log", text)
	if t.Failed() {
		t.Logf("log:\n%s", text)
	}
}

// flip changes every character of s, keeping it base64url.
func flip(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
	}
	return string(b)
}

// dialWS dials a device WebSocket that must be refused; it returns the
// status and body of the refusal.
func dialWS(t *testing.T, u string, h http.Header) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err == nil {
		c.CloseNow()
		t.Fatal("connected")
	}
	if resp == nil {
		t.Fatalf("dial: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// upload posts a one-pixel-sized JPEG (its magic is all the endpoint
// checks) to the vision endpoint as deviceID with token.
func upload(t *testing.T, base, deviceID, token string) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("question", "what is this?")
	fw, _ := mw.CreateFormFile("file", "photo.jpg")
	_, _ = fw.Write([]byte("\xFF\xD8\xFF\xE0 not really a photo \xFF\xD9"))
	_ = mw.Close()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+vision.Path, &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set(xiaozhi.HeaderDeviceID, deviceID)
	req.Header.Set("Authorization", "Bearer "+token)
	return send(t, req)
}

// rest sends one REST request with key as bearer.
func rest(t *testing.T, base, key, method, path, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return send(t, req)
}

// send sends req and returns the answer's status and body.
func send(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// mcpSession connects the go-sdk MCP client to url with key as bearer.
func mcpSession(t *testing.T, u, key string) (*mcp.ClientSession, error) {
	t.Helper()
	hc := &http.Client{Transport: bearerRT(key)}
	cl := mcp.NewClient(&mcp.Implementation{Name: "secrets-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: u, HTTPClient: hc}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

type bearerRT string

func (k bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(k))
	return http.DefaultTransport.RoundTrip(r)
}

// dialSource connects a fake MCP server (internal/mcptest) to
// /mcp/endpoint as source name, with token in ?token= or as bearer. It
// returns 101 once connected (served until the test ends), or a refusal's
// status and body.
func dialSource(t *testing.T, base, name, token string, inQuery bool) (int, string) {
	t.Helper()
	q := url.Values{"name": {name}}
	h := http.Header{}
	if inQuery {
		q.Set("token", token)
	} else {
		h.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(t.Context(), hostiletest.WaitTimeout)
	defer cancel()
	u := "ws" + strings.TrimPrefix(base, "http") + "/mcp/endpoint?" + q.Encode()
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: h})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial %s: %v", name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	srv := mcptest.New(name)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.ServeWebSocket(conn) }()
	t.Cleanup(func() { conn.CloseNow(); <-done })
	return http.StatusSwitchingProtocols, ""
}
