//go:build race

package console_test

// raceEnabled: the race detector slows the gateway several times, and the
// browser shares the machine with it; the timing bounds allow for that.
const raceEnabled = true
