package device

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// catalogServer returns a server with n tools of varying size; every fifth
// is user-only. It also returns the names in catalog order.
func catalogServer(t *testing.T, p Profile, n, budget int) (*Server, []string) {
	t.Helper()
	s, err := NewServer(ServerOptions{Profile: p, PageBudget: budget})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range n {
		name := fmt.Sprintf("self.catalog.tool_with_a_long_name_%02d", i)
		err := s.AddTool(Tool{
			Name:        name,
			Description: strings.Repeat("d", 50+(i*137)%700),
			Properties:  []Property{IntDefault("level", 5, 0, 10), Str("note")},
			UserOnly:    i%5 == 4,
			Handler:     func(context.Context, Args) (any, error) { return true, nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	return s, names
}

type listReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

type page struct {
	Tools []struct {
		Name        string `json:"name"`
		Annotations *struct {
			Audience []string `json:"audience"`
		} `json:"annotations"`
	} `json:"tools"`
	NextCursor *string `json:"nextCursor"`
}

func listPage(t *testing.T, s *Server, params string) (listReply, page) {
	t.Helper()
	raw := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":`+params+`}`)
	var r listReply
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		t.Fatalf("reply %s: %v", raw, err)
	}
	var p page
	if r.Result != nil {
		if err := json.Unmarshal(r.Result, &p); err != nil {
			t.Fatalf("result %s: %v", r.Result, err)
		}
	}
	return r, p
}

func listParams(cursor string, withUser bool) string {
	c, _ := json.Marshal(cursor)
	return fmt.Sprintf(`{"cursor":%s,"withUserTools":%t}`, c, withUser)
}

func TestPagination(t *testing.T) {
	for _, p := range []Profile{ProfileESP32, ProfilePyXiaozhi, ProfileSpec} {
		for _, budget := range []int{DefaultPageBudget, 1500} {
			for _, withUser := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/budget=%d/user=%t", p, budget, withUser), func(t *testing.T) {
					s, names := catalogServer(t, p, 60, budget)
					var want []string
					for i, n := range names {
						if withUser || i%5 != 4 {
							want = append(want, n)
						}
					}
					var got []string
					cursor := ""
					pages := 0
					for {
						r, pg := listPage(t, s, listParams(cursor, withUser))
						if r.Error != nil {
							t.Fatalf("page %d: error %s", pages, r.Error.Message)
						}
						pages++
						if len(r.Result) > budget {
							t.Errorf("page %d: result is %d bytes, budget %d", pages, len(r.Result), budget)
						}
						if len(pg.Tools) == 0 {
							t.Fatalf("page %d is empty", pages)
						}
						for _, tool := range pg.Tools {
							got = append(got, tool.Name)
							userOnly := tool.Annotations != nil && slices.Equal(tool.Annotations.Audience, []string{"user"})
							if userOnly != (strings.HasSuffix(tool.Name, "4") || strings.HasSuffix(tool.Name, "9")) {
								t.Errorf("%s: annotations %v", tool.Name, tool.Annotations)
							}
						}
						if pg.NextCursor == nil {
							break
						}
						// The cursor names the first tool of the next page.
						next := slices.Index(want, *pg.NextCursor)
						if next != len(got) {
							t.Fatalf("nextCursor %q is tool %d of the listing, want %d", *pg.NextCursor, next, len(got))
						}
						// The page is full: the next tool would not have fit.
						s.mu.RLock()
						nextSize := len(s.tools[s.find(*pg.NextCursor)].item)
						s.mu.RUnlock()
						if len(r.Result)+nextSize < budget-len(`],"nextCursor":""}`)-100 {
							t.Errorf("page %d (%d bytes) left room for %q (%d bytes)", pages, len(r.Result), *pg.NextCursor, nextSize)
						}
						cursor = *pg.NextCursor
						if pages > 100 {
							t.Fatal("too many pages")
						}
					}
					if !slices.Equal(got, want) {
						t.Errorf("listed %d tools, want %d:\n got %v\nwant %v", len(got), len(want), got, want)
					}
					if budget == DefaultPageBudget && pages < 2 || budget == 1500 && pages < 10 {
						t.Errorf("only %d pages", pages)
					}
				})
			}
		}
	}
}

func TestPaginationEmptyCatalog(t *testing.T) {
	for _, p := range []Profile{ProfileESP32, ProfilePyXiaozhi, ProfileSpec} {
		s, _ := NewServer(ServerOptions{Profile: p})
		if got, want := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`), `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`; got != want {
			t.Errorf("%s: got %s", p, got)
		}
	}
}

func TestPaginationWithUserToolsNeedsTrue(t *testing.T) {
	s := newTestServer(t, ProfileESP32)
	for _, v := range []string{`1`, `"true"`, `false`, `null`} {
		_, pg := listPage(t, s, `{"withUserTools":`+v+`}`)
		for _, tool := range pg.Tools {
			if tool.Name == "self.reboot" {
				t.Errorf("withUserTools %s revealed the user-only tool", v)
			}
		}
	}
	_, pg := listPage(t, s, `{"withUserTools":true}`)
	if len(pg.Tools) != 4 {
		t.Errorf("withUserTools true listed %d tools, want 4", len(pg.Tools))
	}
}

func TestPaginationUnknownCursor(t *testing.T) {
	tests := map[Profile]string{
		ProfileESP32:     `{"jsonrpc":"2.0","id":1,"error":{"message":"Failed to add tool  because of payload size limit"}}`,
		ProfilePyXiaozhi: `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`,
		ProfileSpec:      `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Invalid cursor"}}`,
	}
	for p, want := range tests {
		t.Run(string(p), func(t *testing.T) {
			s := newTestServer(t, p)
			if got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"self.gone"}}`); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
}

// TestPaginationOnlyUserToolsLeft covers firmware's reply when nothing after
// the cursor is visible.
func TestPaginationOnlyUserToolsLeft(t *testing.T) {
	tests := map[Profile]string{
		ProfileESP32:     `{"jsonrpc":"2.0","id":1,"error":{"message":"Failed to add tool  because of payload size limit"}}`,
		ProfilePyXiaozhi: `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`,
		ProfileSpec:      `{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`,
	}
	for p, want := range tests {
		s := newTestServer(t, p)
		if got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"self.reboot"}}`); got != want {
			t.Errorf("%s: got  %s\nwant %s", p, got, want)
		}
	}
}

func TestPaginationToolTooBig(t *testing.T) {
	big := func(t *testing.T, p Profile, first bool) *Server {
		s, err := NewServer(ServerOptions{Profile: p})
		if err != nil {
			t.Fatal(err)
		}
		h := func(context.Context, Args) (any, error) { return true, nil }
		if !first {
			_ = s.AddTool(Tool{Name: "self.small", Description: "small", Handler: h})
		}
		if err := s.AddTool(Tool{Name: "self.big", Description: strings.Repeat("x", 9000), Handler: h}); err != nil {
			t.Fatal(err)
		}
		_ = s.AddTool(Tool{Name: "self.after", Description: "after", Handler: h})
		return s
	}
	const list = `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"cursor":"self.big"}}`
	const espErr = `{"jsonrpc":"2.0","id":1,"error":{"message":"Failed to add tool self.big because of payload size limit"}}`
	const pyLoop = `{"jsonrpc":"2.0","id":1,"result":{"tools":[],"nextCursor":"self.big"}}`
	const specErr = `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"Failed to add tool self.big because of payload size limit"}}`
	for p, want := range map[Profile]string{ProfileESP32: espErr, ProfilePyXiaozhi: pyLoop, ProfileSpec: specErr} {
		t.Run(string(p), func(t *testing.T) {
			// The page before the big tool points at it.
			s := big(t, p, false)
			_, pg := listPage(t, s, `{}`)
			if len(pg.Tools) != 1 || pg.NextCursor == nil || *pg.NextCursor != "self.big" {
				t.Fatalf("first page %+v", pg)
			}
			// Asking for it fails, or (py) returns the same cursor again.
			if got := handle(s, list); got != want {
				t.Errorf("cursor page: got  %s\nwant %s", got, want)
			}
			// The same when the big tool comes first.
			s = big(t, p, true)
			got := handle(s, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`)
			if got != want {
				t.Errorf("first page: got  %s\nwant %s", got, want)
			}
		})
	}
}

// TestPaginationBudgetExact checks the bound holds to the byte, including the
// nextCursor member, with names long enough to matter.
func TestPaginationBudgetExact(t *testing.T) {
	h := func(context.Context, Args) (any, error) { return true, nil }
	for budget := 300; budget < 420; budget++ {
		s, _ := NewServer(ServerOptions{Profile: ProfileSpec, PageBudget: budget})
		for i := range 12 {
			name := fmt.Sprintf("self.%s_%d", strings.Repeat("n", 10+i*7%40), i)
			if err := s.AddTool(Tool{Name: name, Description: strings.Repeat("d", i*13%60), Handler: h}); err != nil {
				t.Fatal(err)
			}
		}
		cursor := ""
		for range 50 {
			r, pg := listPage(t, s, listParams(cursor, false))
			if r.Error != nil {
				t.Fatalf("budget %d: %s", budget, r.Error.Message)
			}
			if len(r.Result) > budget {
				t.Fatalf("budget %d: page of %d bytes: %s", budget, len(r.Result), r.Result)
			}
			if pg.NextCursor == nil {
				break
			}
			cursor = *pg.NextCursor
		}
	}
}
