package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func scrape(t testing.TB, gw *Gateway) string {
	t.Helper()
	resp, err := http.Get("http://" + gw.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
