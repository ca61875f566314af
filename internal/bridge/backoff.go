package bridge

import (
	"math/rand/v2"
	"time"
)

// Backoff is a capped exponential backoff with jitter. Each delay is drawn
// from [d/2, d], where d doubles from Min up to Max: the jitter spreads a
// fleet of bridges that lost the same gateway, and the lower bound keeps a
// crash loop from spinning. Reset after a healthy connection starts again
// from Min, so a blip after hours of uptime does not wait minutes.
//
// A Backoff is used by one goroutine.
type Backoff struct {
	Min, Max time.Duration
	// Rand returns a number in [0, 1); nil uses math/rand/v2.
	Rand func() float64

	attempt int
}

// Next returns the delay before the next attempt and counts the attempt.
func (b *Backoff) Next() time.Duration {
	d := b.Min
	for i := 0; i < b.attempt && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if d < b.Max {
		b.attempt++
	}
	r := rand.Float64
	if b.Rand != nil {
		r = b.Rand
	}
	half := d / 2
	return half + time.Duration(r()*float64(d-half))
}

// Reset starts again from Min.
func (b *Backoff) Reset() { b.attempt = 0 }
