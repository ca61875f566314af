package mcpserver

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// eventStore is the doors' event store: go-sdk's memory store, which also
// counts the events of each session's standalone stream (the one a GET
// opens) and how many of them a GET stream has sent.
//
// go-sdk starts a GET without Last-Event-ID at the standalone stream's
// first event: each new GET got the whole history again (every
// list_changed, every device log line). The spec forbids sending a message
// on a stream that another stream delivered; the door gives such a GET the
// Last-Event-ID of the last event sent (openStream), so it gets only what
// was stored while no GET was open.
type eventStore struct {
	*mcp.MemoryEventStore

	mu         sync.Mutex
	standalone map[string]*standalone // guarded by mu; by session id
}

// standalone counts a session's standalone stream.
type standalone struct {
	n    int // events stored (indexes 0 to n-1)
	sent int // the first sent of them went out on a GET stream
	open int // GET requests of the stream being served
}

func newEventStore(maxBytes int) *eventStore {
	es := mcp.NewMemoryEventStore(nil)
	es.SetMaxBytes(maxBytes)
	return &eventStore{MemoryEventStore: es, standalone: make(map[string]*standalone)}
}

// Append implements mcp.EventStore. go-sdk calls it with the stream's lock
// held, before it writes the event to the stream's GET if one is open.
func (e *eventStore) Append(ctx context.Context, session, stream string, data []byte) error {
	if err := e.MemoryEventStore.Append(ctx, session, stream, data); err != nil {
		return err
	}
	if stream == "" {
		e.mu.Lock()
		e.stream(session).n++
		e.mu.Unlock()
	}
	return nil
}

// stream returns session's counts, made on first use. e.mu is held.
func (e *eventStore) stream(session string) *standalone {
	st := e.standalone[session]
	if st == nil {
		st = new(standalone)
		e.standalone[session] = st
	}
	return st
}

// SessionClosed implements mcp.EventStore.
func (e *eventStore) SessionClosed(ctx context.Context, session string) error {
	e.mu.Lock()
	delete(e.standalone, session)
	e.mu.Unlock()
	return e.MemoryEventStore.SessionClosed(ctx, session)
}

// openStream is called before go-sdk serves a GET of session's standalone
// stream (of a session the door knows). For a GET without Last-Event-ID
// (fresh), it returns the Last-Event-ID that makes the GET start after the
// events an earlier GET sent, "" to start at the first. end, called once
// go-sdk is done, says whether the GET was served (200): the events stored
// until then went out on it.
//
// An earlier GET still being served has sent all that is stored: it is
// ending (go-sdk has let go of the stream, the door has not yet counted
// it), or it is live and go-sdk refuses this one (409). Events lost to
// the store's bound are skipped rather than refused (400): a fresh GET
// asked for none of them.
func (e *eventStore) openStream(ctx context.Context, session string, fresh bool) (lastEventID string, end func(served bool)) {
	e.mu.Lock()
	st := e.stream(session)
	n, last := st.n, st.sent-1
	if st.open > 0 {
		last = n - 1
	}
	st.open++
	e.mu.Unlock()
	end = func(served bool) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if st := e.standalone[session]; st != nil {
			st.open--
			if served {
				st.sent = st.n
			}
		}
	}
	if !fresh {
		return "", end
	}
	for _, err := range e.After(ctx, session, "", last) {
		if err != nil {
			last = n - 1 // purged: start at what comes next
		}
		break
	}
	if last < 0 {
		return "", end
	}
	return "_" + strconv.Itoa(last), end // go-sdk's event id: <stream id>_<index>, "" for the standalone stream
}

// standaloneStream reports whether GET r asks for the standalone stream:
// it has no Last-Event-ID, or one of the stream "" ("_<index>").
func standaloneStream(r *http.Request) bool {
	id := r.Header.Get("Last-Event-ID")
	return id == "" || strings.HasPrefix(id, "_")
}
