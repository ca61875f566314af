package cluster

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// What keeps a routed call cheap (docs/cluster.md, "Performance"): one
// reply subscription for all the calls a node routes, and one channel
// feeding long-lived goroutines with the messages to every held device.

// servers is how many goroutines wait for messages to held devices; when
// one takes a message and none is left waiting, it starts another first,
// so a long call never holds up the next.
const servers = 64

// inbound is how many messages to held devices may wait for a server
// goroutine (half a MiB of pointers). Past it nats.go drops the message (a
// slow consumer, logged), as it would past an async subscription's pending
// limit: that takes a burst faster than goroutines start.
const inbound = 1 << 16

// replyBuffer is how many replies of one call may wait for its caller, as
// the buffered channel a per-call subscription had.
const replyBuffer = 64

// fastPath is the part of a Node that routed calls share.
type fastPath struct {
	once sync.Once
	err  error
	// prefix is "_INBOX.<random>.": a call's reply subject is prefix and
	// its id, all under one wildcard subscription. A subscription per call
	// would cost a SUB and an UNSUB on this server and interest updates to
	// every routed server, per call. Serving nodes reply on prefix and
	// sharedReply, the call's id in the message: a subject per call would
	// miss every server's match cache, per message (and evict from it).
	// The call's own subject takes NATS's no-responders status and replies
	// from nodes of older versions.
	prefix string
	sub    *nats.Subscription

	mu      sync.Mutex
	pending map[string]chan *nats.Msg // by call id; guarded by mu

	// inbox takes the messages of every held device's subscription. A
	// subscription with a handler would cost a goroutine per held device,
	// and a hand-over per call from it to a server goroutine.
	inbox chan *nats.Msg
	idle  atomic.Int32 // server goroutines waiting on inbox

	// alive holds where to reply to the calls served here, by call id:
	// one ticker sends all their keepalives, not a goroutine and a ticker
	// per call. Guarded by mu.
	alive map[string]replyTo
}

// sharedReply ends a node's shared reply subject (see fastPath.prefix); a
// call's id, from nuid, is never this short.
const sharedReply = "r"

// replyTo is where a served call's replies go: its subject, and the call's
// id when that is the caller's shared reply subject.
type replyTo struct {
	subject, id string
}

// sharedReplyTo is where to reply to call id, whose reply subject is
// subject: the caller's shared reply subject, or subject when it has no
// prefix to take it from.
func sharedReplyTo(subject, id string) replyTo {
	i := strings.LastIndexByte(subject, '.')
	if i < 0 {
		return replyTo{subject: subject}
	}
	return replyTo{subject: subject[:i+1] + sharedReply, id: id}
}

// start subscribes the reply inbox and starts the server goroutines, once.
func (n *Node) start() error {
	f := &n.fast
	f.once.Do(func() {
		f.prefix = nats.InboxPrefix + nuid.Next() + "."
		f.mu.Lock() // a metrics scrape may read it already
		f.pending = make(map[string]chan *nats.Msg)
		f.mu.Unlock()
		f.inbox = make(chan *nats.Msg, inbound)
		for range servers {
			go n.serveLoop()
		}
		go n.keepAlive()
		f.sub, f.err = n.nc.Subscribe(f.prefix+"*", f.deliver)
		if f.err != nil {
			f.err = fmt.Errorf("cluster: subscribing to replies: %w", f.err)
		}
	})
	return f.err
}

// serveLoop serves messages to held devices until the node closes. Past
// servers idle goroutines, one that has served leaves: a burst's extra
// goroutines do not stay.
func (n *Node) serveLoop() {
	f := &n.fast
	for {
		f.idle.Add(1)
		select {
		case m := <-f.inbox:
			if f.idle.Add(-1) == 0 {
				go n.serveLoop()
			}
			n.onDevice(m)
			if f.idle.Load() >= servers {
				return
			}
		case <-n.ctx.Done():
			f.idle.Add(-1)
			return
		}
	}
}

// expect returns the reply subject of call id (a nuid) and the channel its
// replies arrive on; done forgets it.
func (n *Node) expect(id string) (subject string, replies <-chan *nats.Msg, done func(), err error) {
	if err := n.start(); err != nil {
		return "", nil, nil, err
	}
	f := &n.fast
	c := make(chan *nats.Msg, replyBuffer)
	f.mu.Lock()
	f.pending[id] = c
	f.mu.Unlock()
	return f.prefix + id, c, func() {
		f.mu.Lock()
		delete(f.pending, id)
		f.mu.Unlock()
	}, nil
}

// deliver hands a reply to its call. A reply for a call that has ended (a
// keepalive racing the result) is dropped. When its caller is too slow for
// its progress, the oldest reply waiting is dropped for the newest, as NATS
// drops messages for a slow subscriber: the result, which comes last, is
// never the one lost.
func (f *fastPath) deliver(m *nats.Msg) {
	id, ok := strings.CutPrefix(m.Subject, f.prefix)
	if !ok {
		return
	}
	f.mu.Lock()
	var c chan *nats.Msg
	if id == sharedReply {
		if b, ok := replyCallID(m.Data); ok {
			c = f.pending[string(b)]
		}
	} else {
		c = f.pending[id]
	}
	f.mu.Unlock()
	if c == nil {
		return
	}
	select {
	case c <- m:
		return
	default:
	}
	// The subscription's one goroutine is the only sender: once one is
	// taken out, there is room.
	select {
	case <-c:
	default:
	}
	select {
	case c <- m:
	default:
	}
}

// serving makes call id, answered on reply, one of those keepAlive
// reports alive until served.
func (f *fastPath) serving(id string, reply replyTo) {
	f.mu.Lock()
	if f.alive == nil {
		f.alive = make(map[string]replyTo)
	}
	f.alive[id] = reply
	f.mu.Unlock()
}

func (f *fastPath) served(id string) {
	f.mu.Lock()
	delete(f.alive, id)
	f.mu.Unlock()
}

// keepAlive tells the callers of the calls served here, every keepalive,
// that their call still runs. A call's first keepalive may come sooner
// than keepalive after it started, never later.
func (n *Node) keepAlive() {
	t := time.NewTicker(n.cfg.keepalive)
	defer t.Stop()
	alive := &replyMsg{Kind: kindAlive, Node: n.cfg.NodeID}
	var replies []replyTo
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		f := &n.fast
		f.mu.Lock()
		replies = replies[:0]
		for _, r := range f.alive {
			replies = append(replies, r)
		}
		f.mu.Unlock()
		for _, r := range replies {
			if err := n.nc.Publish(r.subject, appendReply(nil, r.id, alive)); err != nil {
				n.log.Warn("cluster: sending a keepalive", "error", err)
			}
		}
	}
}
