package bench

import (
	"math"
	"math/bits"
	"time"
)

// Histogram records durations in log-linear buckets, like an HDR histogram
// with 128 sub-buckets per power of two: every recorded value is kept within
// 1/128 (0.8 %) of its true value, from 1 ns to about 2.4 hours, in a fixed
// 37 KiB array. Recording is two shifts and an increment, and never allocates.
//
// A Histogram is not safe for concurrent use: the load phases give each
// worker its own and [Histogram.Merge] them when the workers are done, so
// the hot path takes no lock.
type Histogram struct {
	counts [histBuckets]uint64
	n      uint64
	sum    time.Duration
	min    time.Duration
	max    time.Duration
}

const (
	histSubBits = 7
	histSub     = 1 << histSubBits // sub-buckets per power of two
	// histMaxExp bounds the exponent: values of 2^(histMaxExp+histSubBits+1) ns
	// (about 2.4 hours) and more land in the last bucket.
	histMaxExp  = 35
	histBuckets = (histMaxExp + 2) * histSub
)

// bucketOf returns the bucket of a value in nanoseconds. Values below histSub
// have a bucket each; above, bucket (e+1)·histSub + m - histSub holds the
// values whose top histSubBits+1 bits are m and whose remaining bits number e.
func bucketOf(v uint64) int {
	if v < histSub {
		return int(v)
	}
	e := bits.Len64(v) - histSubBits - 1
	if e > histMaxExp {
		return histBuckets - 1
	}
	m := v >> uint(e)
	return (e+1)*histSub + int(m-histSub)
}

// bucketRange returns the smallest value of bucket i and the bucket's width.
func bucketRange(i int) (low, width uint64) {
	if i < histSub {
		return uint64(i), 1
	}
	e := i/histSub - 1
	m := uint64(i%histSub + histSub)
	return m << uint(e), 1 << uint(e)
}

// Record adds one duration; negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.n++
	h.sum += d
}

// Merge adds every value recorded in o.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of recorded values.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max return the exact extremes; 0 when empty.
func (h *Histogram) Min() time.Duration { return h.min }

// Max returns the largest recorded value; 0 when empty.
func (h *Histogram) Max() time.Duration { return h.max }

// Mean returns the exact mean; 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Quantile returns the value below which a fraction q (0..1) of the recorded
// values lie: the midpoint of the bucket holding the ⌈q·n⌉-th smallest
// value, clamped to the exact min and max. It returns 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, width := bucketRange(i)
			v := time.Duration(low + (width-1)/2)
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}

// Latency summarises a histogram for a report, in milliseconds so that the
// JSON reads without unit conversions.
type Latency struct {
	Count  uint64  `json:"count"`
	MeanMS float64 `json:"mean_ms"`
	MinMS  float64 `json:"min_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p999_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// Summary returns the histogram's count, mean, extremes and percentiles.
func (h *Histogram) Summary() Latency {
	return Latency{
		Count:  h.n,
		MeanMS: ms(h.Mean()),
		MinMS:  ms(h.min),
		P50MS:  ms(h.Quantile(0.50)),
		P90MS:  ms(h.Quantile(0.90)),
		P99MS:  ms(h.Quantile(0.99)),
		P999MS: ms(h.Quantile(0.999)),
		MaxMS:  ms(h.max),
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
