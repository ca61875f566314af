// Package audit writes and reads the audit log: one record per tool call
// through any door (REST, MCP, the agent...), with who called, which device
// and tool, the arguments (large values replaced by a digest), the outcome
// and the latency; and one record per administrative action (forget,
// revoke, keys, OAuth grants: hub.AuditAction).
//
// The hub calls [Writer.Record] synchronously at the end of every call
// ([hub.Config.Audit]); the writer queues the record and [Writer.Run] writes
// batches to the store in the background, applying retention by age and by
// count. Nothing is dropped while it runs: a full queue slows calls down, a
// failed write is retried, and stopping writes everything queued; a crash
// loses what is queued, up to Config.FlushInterval of records. The rare
// records a crash must not lose, administrative actions and queued calls'
// ends, go through [Writer.RecordNow], which returns once they are stored.
//
//	w, err := audit.New(audit.Config{Store: st, Retention: 30 * 24 * time.Hour})
//	h := hub.New(hub.Config{Audit: w.Record, AuditNow: w.RecordNow})
//	go w.Run(ctx) // until ctx ends, then drains
//
// # Arguments
//
// [Digest] replaces every argument value larger than Config.MaxValueBytes
// (default 1 KiB) by {"$digest":"sha256:<hex>","$bytes":N}, keeping the rest
// of the JSON as sent.
package audit
