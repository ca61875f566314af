package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// samples is one scrape of a gateway's /metrics: each series, written as
// name{labels}, and its value.
type samples map[string]float64

// sum adds every series of the metric name, whatever its labels.
func (s samples) sum(name string) float64 {
	var total float64
	for k, v := range s {
		if k == name || (strings.HasPrefix(k, name) && k[len(name)] == '{') {
			total += v
		}
	}
	return total
}

// get returns one series' value and whether it was present.
func (s samples) get(series string) (float64, bool) {
	v, ok := s[series]
	return v, ok
}

// scrape reads base+"/metrics" in the Prometheus text format.
func scrape(ctx context.Context, hc *http.Client, base string) (samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape metrics: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("scrape metrics: %s answered %s: it requires an API key, given with --key or MCPGATE_API_KEY", base, resp.Status)
	default:
		return nil, fmt.Errorf("scrape metrics: %s answered %s", base, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text exposition format: comment lines
// are skipped, and each other line is a series, a value and an optional
// timestamp. Label values may hold spaces, so the series ends at the last '}'.
func parseMetrics(r io.Reader) (samples, error) {
	out := samples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		var series, rest string
		if i := strings.LastIndexByte(line, '}'); i >= 0 && strings.IndexByte(line, '{') >= 0 {
			series, rest = line[:i+1], line[i+1:]
		} else {
			var ok bool
			series, rest, ok = strings.Cut(line, " ")
			if !ok {
				return nil, fmt.Errorf("metrics: malformed line %q", line)
			}
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics: no value in line %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: line %q: %w", line, err)
		}
		out[series] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return out, nil
}
