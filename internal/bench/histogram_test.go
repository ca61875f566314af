package bench

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsCoverEveryValue(t *testing.T) {
	t.Parallel()
	values := []uint64{0, 1, 127, 128, 129, 255, 256, 257, 1000, 65535, 1 << 20, 1<<20 + 12345, 1e9, 1e12, 1<<43 - 1}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		values = append(values, rng.Uint64N(1<<43))
	}
	for _, v := range values {
		i := bucketOf(v)
		low, width := bucketRange(i)
		if v < low || v >= low+width {
			t.Fatalf("value %d in bucket %d = [%d, %d)", v, i, low, low+width)
		}
		if v >= histSub && float64(width)/float64(low) > 1.0/histSub+1e-12 {
			t.Fatalf("bucket %d of %d is %d wide: more than 1/%d of %d", i, v, width, histSub, low)
		}
	}
	// Buckets are contiguous: each starts where the previous one ends.
	for i := 1; i < histBuckets; i++ {
		pl, pw := bucketRange(i - 1)
		if l, _ := bucketRange(i); l != pl+pw {
			t.Fatalf("bucket %d starts at %d, previous ends at %d", i, l, pl+pw)
		}
	}
	if got := bucketOf(1 << 62); got != histBuckets-1 {
		t.Errorf("huge value in bucket %d, want the last (%d)", got, histBuckets-1)
	}
}

func TestQuantilesWithinPrecision(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	var h Histogram
	exact := make([]time.Duration, 0, 100000)
	for range cap(exact) {
		// Log-normal-ish latencies between 20 µs and 50 ms.
		d := time.Duration(20e3 * (1 + rng.ExpFloat64()*rng.ExpFloat64()*30))
		d = min(d, 50*time.Millisecond)
		h.Record(d)
		exact = append(exact, d)
	}
	slices.Sort(exact)
	for _, q := range []float64{0, 0.5, 0.9, 0.99, 0.999, 1} {
		rank := max(int(float64(len(exact))*q+0.999999999), 1)
		want := exact[rank-1]
		got := h.Quantile(q)
		if diff := float64(got-want) / float64(want); diff > 1.0/histSub || diff < -1.0/histSub {
			t.Errorf("q%.3f = %s, exact %s: off by %.2f %%", q, got, want, diff*100)
		}
	}
	if h.Min() != exact[0] || h.Max() != exact[len(exact)-1] {
		t.Errorf("min/max = %s/%s, want %s/%s", h.Min(), h.Max(), exact[0], exact[len(exact)-1])
	}
	if h.Count() != uint64(len(exact)) {
		t.Errorf("count = %d, want %d", h.Count(), len(exact))
	}
}

func TestHistogramMergeAndEmpty(t *testing.T) {
	t.Parallel()
	var empty Histogram
	if empty.Quantile(0.99) != 0 || empty.Mean() != 0 || empty.Summary().Count != 0 {
		t.Error("an empty histogram reports values")
	}
	var a, b, all Histogram
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i) * time.Microsecond
		all.Record(d)
		if i%2 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&empty)
	m.Merge(&b)
	if m != all {
		t.Errorf("merged summary %+v, want %+v", m.Summary(), all.Summary())
	}
	s := m.Summary()
	if !(s.MinMS <= s.P50MS && s.P50MS <= s.P90MS && s.P90MS <= s.P99MS && s.P99MS <= s.P999MS && s.P999MS <= s.MaxMS) {
		t.Errorf("percentiles out of order: %+v", s)
	}
	if s.MeanMS < 0.5 || s.MeanMS > 0.501 {
		t.Errorf("mean = %vms, want 0.5005ms", s.MeanMS)
	}
	var neg Histogram
	neg.Record(-time.Second)
	if neg.Min() != 0 || neg.Count() != 1 {
		t.Errorf("negative duration: min %s count %d, want 0 and 1", neg.Min(), neg.Count())
	}
}

func TestRecordDoesNotAllocate(t *testing.T) {
	var h Histogram
	if n := testing.AllocsPerRun(1000, func() { h.Record(1234567) }); n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
}
