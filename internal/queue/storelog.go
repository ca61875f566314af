package queue

import "log/slog"

// warnStore logs a periodic task's store failure, with attrs: at once,
// then once a minute while it keeps failing (store.FailureLog), not at
// every sweep or retry.
func (q *Queue) warnStore(task string, err error, attrs ...any) {
	q.storeLog.Failed(q.log, slog.LevelWarn, task, err, attrs...)
}

// storeOK notes that task reached the store again: a line if it was
// failing, and its next failure is logged at once.
func (q *Queue) storeOK(task string) {
	q.storeLog.OK(q.log, task, "the store answers again: "+task)
}
