package cluster

import (
	"time"
)

// A device that moves closes its session on the node it left by the claim
// of the node it reached, and claims compare the two nodes' clocks: nodes
// whose clocks differ by more than the time between a device's two
// connections can leave it with two sessions. So each node estimates, from
// the clock the others put on their beats, how far theirs are from its own,
// logs when that is too far, and reports it (mcpgate_cluster_clock_offset_seconds).

// maxClockOffset is how far apart two nodes' clocks may be before this node
// warns: devices rarely reconnect within a second.
const maxClockOffset = time.Second

// clockWarnEvery is how often the warning about one node repeats.
const clockWarnEvery = 10 * time.Minute

// clockBacklog: a beat applied behind this many view messages (a reconnect
// storm) was late enough to read as a clock behind, and is not a sample;
// fewer delay it by milliseconds.
const clockBacklog = 100

// clockOffset estimates how far a peer's clock is ahead of this node's
// from its last beats: each sample is its clock at sending minus this
// node's at applying, the true offset less the beat's time on the way,
// which only makes a sample smaller, so the largest recent one is the best.
type clockOffset struct {
	samples [8]time.Duration
	n       int // samples taken
	warned  time.Time
	// last is the previous beat's difference, taken as a sample or not;
	// heard says there was one.
	last  time.Duration
	heard bool
}

// sample takes d, a beat's difference, as a sample when it is within
// tolerance of the previous beat's: a beat that waited in a queue reads as
// a clock behind by as long as it waited. A node resuming from a stall
// applies the others' beats of that time at once, each behind by a beat
// less than the one before; none agrees with the one before it, and the
// first beat after them does again. It reports whether d was taken.
func (c *clockOffset) sample(d, tolerance time.Duration) bool {
	ok := c.heard && (d-c.last).Abs() <= tolerance
	c.last, c.heard = d, true
	if ok {
		c.add(d)
	}
	return ok
}

func (c *clockOffset) add(d time.Duration) {
	c.samples[c.n%len(c.samples)] = d
	c.n++
}

// estimate returns the offset, and false before any sample.
func (c *clockOffset) estimate() (time.Duration, bool) {
	if c.n == 0 {
		return 0, false
	}
	best := c.samples[0]
	for _, d := range c.samples[1:min(c.n, len(c.samples))] {
		best = max(best, d)
	}
	return best, true
}

// heardClock takes a beat's difference as a sample of peer node's clock
// offset, if it agrees within half a heartbeat with the previous beat's,
// and warns when the estimate is too far. v.mu must be held.
func (v *view) heardClock(node string, p *peer, sample time.Duration) {
	if !p.clock.sample(sample, v.n.cfg.Heartbeat/2) {
		return
	}
	est, _ := p.clock.estimate()
	if est.Abs() <= maxClockOffset || time.Since(p.clock.warned) < clockWarnEvery {
		return
	}
	p.clock.warned = time.Now()
	v.n.log.Warn("cluster: a node's clock is far from this one's: a device moving between them may keep a session on each; keep the nodes' clocks NTP-synchronised",
		"other", node, "ahead_by", est.Round(time.Millisecond))
}

// clockOffsets returns how far each peer's clock is estimated ahead of this
// node's.
func (v *view) clockOffsets() map[string]time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string]time.Duration, len(v.peers))
	for id, p := range v.peers {
		if est, ok := p.clock.estimate(); ok {
			out[id] = est
		}
	}
	return out
}

// now is the node's wall clock, as its beats carry it.
func (n *Node) now() time.Time { return n.cfg.now() }
