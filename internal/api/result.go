package api

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/mcpgate/mcpgate/internal/mcpclient"
)

// resultPool holds the buffers tool results are written from.
var resultPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// maxPooledResult keeps a rare huge result from pinning memory in the pool.
const maxPooledResult = 64 << 10

// writeResult answers with a tool call's result: the bytes writeJSON would
// write, encoded in one pass into a pooled buffer (see Result.AppendJSON).
func writeResult(w http.ResponseWriter, res *mcpclient.Result) {
	bp := resultPool.Get().(*[]byte)
	b, err := res.AppendJSON((*bp)[:0])
	if err != nil {
		resultPool.Put(bp)
		writeJSON(w, http.StatusOK, res) // the encoder explains what is wrong
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b) // the client may be gone; nothing to do about it
	if cap(b) <= maxPooledResult {
		*bp = b
		resultPool.Put(bp)
	}
}
