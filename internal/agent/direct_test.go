package agent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/mcpgate/mcpgate/device"
	"github.com/mcpgate/mcpgate/internal/agent"
	"github.com/mcpgate/mcpgate/internal/agent/llmtest"
	"github.com/mcpgate/mcpgate/internal/auth"
	"github.com/mcpgate/mcpgate/internal/gateway"
	"github.com/mcpgate/mcpgate/internal/gatewaytest"
	"github.com/mcpgate/mcpgate/internal/hub"
	"github.com/mcpgate/mcpgate/xiaozhi"
)

// newAgent runs a gateway without a model and an agent of its own on the
// gateway's hub, so a test can give it any principal and outputs.
func newAgent(t *testing.T, model llmtest.Model, cfg agent.Config) (*gateway.Gateway, *agent.Agent, *llmtest.Server) {
	t.Helper()
	gw, _ := gatewaytest.Start(t, gateway.Config{})
	stub := llmtest.New(t, model)
	cfg.Hub, cfg.BaseURL, cfg.Model = gw.Hub(), stub.URL, "stub-model"
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return gw, a, stub
}

func TestKeyRestrictions(t *testing.T) {
	gw, a, stub := newAgent(t, func(int, llmtest.Request) llmtest.Reply { return llmtest.Reply{Content: "hi"} }, agent.Config{})
	d := runSim(t, gw, 0)
	ctx := context.Background()

	onlyGetters := &auth.Principal{KeyID: "k1", Scope: auth.ScopeCall, Tools: []string{"self.get_*"}}
	if _, err := a.Chat(ctx, agent.Request{Device: d.MAC, Text: "hi", Principal: onlyGetters}, nil); err != nil {
		t.Fatal(err)
	}
	var offered []string
	for _, tl := range stub.Requests()[0].Tools {
		offered = append(offered, tl.Function.Name)
	}
	if strings.Join(offered, ",") != fnStatus {
		t.Errorf("a key limited to self.get_* was offered %v", offered)
	}

	for _, tc := range []struct {
		name string
		p    *auth.Principal
		want error
	}{
		{"no principal", nil, agent.ErrForbidden},
		{"read scope", &auth.Principal{KeyID: "k2", Scope: auth.ScopeRead}, agent.ErrForbidden},
		{"other devices", &auth.Principal{KeyID: "k3", Scope: auth.ScopeCall, Devices: []string{"kitchen-*"}}, hub.ErrDeviceNotFound},
	} {
		if _, err := a.Chat(ctx, agent.Request{Device: d.MAC, Text: "hi", Principal: tc.p}, nil); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.want)
		}
	}
	if n := len(stub.Requests()); n != 1 {
		t.Errorf("refused chats reached the model: %d requests", n)
	}
}

func TestAuditCaller(t *testing.T) {
	gw, a, _ := newAgent(t, llmtest.Script(
		llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "s", Name: fnStatus}}},
		llmtest.Reply{Content: "fine"},
	), agent.Config{})
	d := runSim(t, gw, 0)
	sub := gw.Hub().Subscribe()
	defer sub.Close()
	p := &auth.Principal{KeyID: "key-7", Scope: auth.ScopeCall}
	if _, err := a.Chat(context.Background(), agent.Request{Device: d.MAC, Text: "status?", Principal: p}, nil); err != nil {
		t.Fatal(err)
	}
	for ev := range sub.C {
		if ev.Type != hub.EventCall {
			continue
		}
		data, ok := ev.Data.(hub.CallData)
		if !ok || data.Door != "agent" || data.Caller != "key-7" || data.Tool != "self.get_device_status" {
			t.Fatalf("call event: %+v", ev.Data)
		}
		return
	}
}

type recorder struct {
	mu    sync.Mutex
	notes []string
	llm   []xiaozhi.LLM
}

func (r *recorder) Notify(_ context.Context, id, method string, params any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := params.(agent.AIMessage)
	r.notes = append(r.notes, id+" "+method+" "+m.Type+":"+m.Content)
	return nil
}

func (r *recorder) SendLLM(_ context.Context, id string, msg xiaozhi.LLM) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.llm = append(r.llm, msg)
	return nil
}

func TestXiaozhiDeviceGetsTheReply(t *testing.T) {
	rec := &recorder{}
	gw, a, _ := newAgent(t, llmtest.Script(llmtest.Reply{Reasoning: "hmm", Content: "It is sunny."}),
		agent.Config{Notifier: rec, LLMSender: rec})
	d := runSim(t, gw, 0)
	if _, err := a.Chat(context.Background(), agent.Request{Device: d.MAC, Text: "weather?", Principal: auth.Local()}, nil); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.llm) != 1 || rec.llm[0].Type != "llm" || rec.llm[0].Text != "It is sunny." {
		t.Errorf("llm messages: %+v", rec.llm)
	}
	if len(rec.notes) != 0 {
		t.Errorf("a XiaoZhi device got notifications: %q", rec.notes)
	}
}

func TestEndpointTools(t *testing.T) {
	gw, a, stub := newAgent(t, llmtest.Script(
		llmtest.Reply{ToolCalls: []llmtest.Call{{ID: "x", Name: "calc_add", Arguments: `{"a":2,"b":3}`}}},
		llmtest.Reply{Content: "5"},
		llmtest.Reply{Content: "no tools for you"},
	), agent.Config{})
	d := runSim(t, gw, 0)
	src := runEndpoint(t, gw, "calc")
	sd, err := gw.Hub().Device(src)
	if err != nil || sd.Alias != "calc" {
		t.Fatalf("endpoint source %s: %+v %v", src, sd, err)
	}
	r, err := a.Chat(context.Background(), agent.Request{Device: d.MAC, Text: "2+3", Principal: auth.Local()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Calls) != 1 || r.Calls[0].Device != src || r.Calls[0].Tool != "add" || r.Calls[0].IsError {
		t.Fatalf("calls: %+v", r.Calls)
	}
	req := stub.Requests()
	if _, ok := req[0].Tool("calc_echo"); !ok {
		t.Errorf("endpoint tools not offered: %+v", req[0].Tools)
	}
	// The word "add" in add's own description is a word, not the function.
	if add, _ := req[0].Tool("calc_add"); add.Function.Description != "(calc) test tool add" {
		t.Errorf("calc_add's description: %q", add.Function.Description)
	}
	if got := req[1].ToolMessages()["x"]; got != "5" {
		t.Errorf("calc_add result to the model: %q", got)
	}

	// A key that cannot see the source is not offered its tools.
	p := &auth.Principal{KeyID: "k", Scope: auth.ScopeCall, Devices: []string{d.MAC}}
	if _, err := a.Chat(context.Background(), agent.Request{Device: d.MAC, Text: "2+3", Principal: p, Conversation: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := stub.Requests()[2].Tool("calc_echo"); ok {
		t.Error("a key limited to the device was offered the endpoint's tools")
	}
}

// A device tool and an endpoint tool with the same qualified name (the
// device's own "calc.echo", endpoint calc's "echo"): the device's keeps the
// plain function name, the endpoint's gets a hashed one, and the model can
// call each.
func TestEndpointToolNameClash(t *testing.T) {
	var mu sync.Mutex
	var offered []llmtest.Tool
	endpointFn := func(req llmtest.Request) string {
		for _, tl := range req.Tools {
			if strings.HasPrefix(tl.Function.Name, "calc_echo_") && strings.HasPrefix(tl.Function.Description, "(calc)") {
				return tl.Function.Name
			}
		}
		return "calc_echo_missing"
	}
	gw, a, _ := newAgent(t, func(n int, req llmtest.Request) llmtest.Reply {
		if n > 0 {
			return llmtest.Reply{Content: "done"}
		}
		mu.Lock()
		offered = req.Tools
		mu.Unlock()
		return llmtest.Reply{ToolCalls: []llmtest.Call{
			{ID: "dev", Name: "calc_echo", Arguments: `{"text":"hi"}`},
			{ID: "ep", Name: endpointFn(req), Arguments: `{"text":"hi"}`},
		}}
	}, agent.Config{})
	const id = "02:00:00:00:0c:01"
	runDevice(t, gw, id, device.Tool{Name: "calc.echo", Description: "Echo on the device.", Properties: []device.Property{device.Str("text")},
		Handler: func(_ context.Context, args device.Args) (any, error) { return "device:" + args.String("text"), nil }})
	src := runEndpoint(t, gw, "calc")

	r, err := a.Chat(context.Background(), agent.Request{Device: id, Text: "echo hi", Principal: auth.Local()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	var names []string
	for _, tl := range offered {
		names = append(names, tl.Function.Name)
	}
	mu.Unlock()
	if len(r.Calls) != 2 {
		t.Fatalf("calls: %+v; offered %v", r.Calls, names)
	}
	for _, c := range r.Calls {
		switch c.ID {
		case "dev":
			if c.Function != "calc_echo" || c.Device != id || c.Tool != "calc.echo" || c.IsError || c.Result.Text() != "device:hi" {
				t.Errorf("the device's tool: %+v", c)
			}
		case "ep":
			if !strings.HasPrefix(c.Function, "calc_echo_") || len(c.Function) != len("calc_echo_")+8 || c.Device != src || c.Tool != "echo" ||
				c.IsError || c.Result.Text() != "hi" {
				t.Errorf("the endpoint's tool (offered %v): %+v", names, c)
			}
		}
	}
}

// TestHistoryIsTheCallers: two keys naming the same conversation of a
// device each have their own: one key never sees the other's turns.
func TestHistoryIsTheCallers(t *testing.T) {
	gw, a, stub := newAgent(t, func(int, llmtest.Request) llmtest.Reply { return llmtest.Reply{Content: "ok"} }, agent.Config{})
	d := runSim(t, gw, 0)
	ctx := context.Background()
	admin := &auth.Principal{KeyID: "admin", Scope: auth.ScopeAdmin}
	getters := &auth.Principal{KeyID: "getters", Scope: auth.ScopeCall, Tools: []string{"self.get_*"}}
	for _, c := range []struct {
		p    *auth.Principal
		text string
	}{{admin, "the admin's secret"}, {getters, "what did the admin say?"}, {admin, "and again"}} {
		if _, err := a.Chat(ctx, agent.Request{Device: d.MAC, Text: c.text, Conversation: "shared", Principal: c.p}, nil); err != nil {
			t.Fatal(err)
		}
	}
	texts := func(i int) string {
		var s []string
		for _, m := range stub.Requests()[i].Messages {
			s = append(s, m.Content)
		}
		return strings.Join(s, "|")
	}
	if got := texts(1); strings.Contains(got, "secret") {
		t.Errorf("another key's chat saw the admin's conversation: %s", got)
	}
	if got := texts(2); !strings.Contains(got, "the admin's secret") || strings.Contains(got, "what did the admin say") {
		t.Errorf("the admin's next turn: %s, want its own history only", got)
	}
}
