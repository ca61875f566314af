package store

import (
	"log/slog"
	"sync"
	"time"
)

// FailureLogEvery is the least time between two lines of FailureLog for
// one task.
const FailureLogEvery = time.Minute

// FailureLog logs the failures of store work that is tried again and
// again (a writer retrying every few seconds, a read each request makes)
// while the store is down: the first failure of a task at once, then one
// line a minute with how many it left out ("suppressed"), and one line when
// the task succeeds again. Its zero value is ready to use; it is safe for
// concurrent use.
type FailureLog struct {
	mu    sync.Mutex
	tasks map[string]*failures // guarded by mu
}

type failures struct {
	logged     time.Time // the last line
	suppressed int       // failures since, not logged
}

// Failed logs task's failure err at level (Warn or Error; always Error when
// err is a damaged SQLite file, which no retry mends), with attrs, unless one
// was logged less than FailureLogEvery ago.
func (l *FailureLog) Failed(log *slog.Logger, level slog.Level, task string, err error, attrs ...any) {
	now := time.Now()
	l.mu.Lock()
	if l.tasks == nil {
		l.tasks = map[string]*failures{}
	}
	f := l.tasks[task]
	if f == nil {
		f = &failures{}
		l.tasks[task] = f
	}
	if !f.logged.IsZero() && now.Sub(f.logged) < FailureLogEvery {
		f.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := f.suppressed
	f.logged, f.suppressed = now, 0
	l.mu.Unlock()
	attrs = append(attrs, "error", err)
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	if level >= slog.LevelError || Damaged(err) {
		log.Error(task, attrs...)
	} else {
		log.Warn(task, attrs...)
	}
}

// OK notes that task succeeded: if it was failing, msg is logged (at Info)
// and its next failure is logged at once.
func (l *FailureLog) OK(log *slog.Logger, task, msg string) {
	l.mu.Lock()
	_, was := l.tasks[task]
	delete(l.tasks, task)
	l.mu.Unlock()
	if was {
		log.Info(msg)
	}
}
