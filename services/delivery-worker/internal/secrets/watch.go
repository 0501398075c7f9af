package secrets

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"time"
)

// Watcher reloads a secrets file into a Current when its content changes.
// It hashes the content on every poll rather than trusting mtime: mounted
// secrets (a Kubernetes Secret volume) are swapped by renaming a symlinked
// directory, and an editor can keep the mtime; the file is small.
type Watcher struct {
	Path     string
	Interval time.Duration
	Current  *Current
	Log      *slog.Logger
	// OnReload, if set, is told the outcome of every reload that found a
	// changed file (ok=false: refused, the old set stays).
	OnReload func(ok bool)
}

// Run polls until ctx is done. It returns nil then: a file that cannot be
// read or parsed is logged and the previous set kept, never fatal, since a
// half-written file during rotation must not stop delivery.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	last := w.Current.Get().sum
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		last = w.Poll(last)
	}
}

// Poll reads the file once and swaps in its set when its hash differs from
// last; it returns the hash now in force. Exposed so tests can step it.
func (w *Watcher) Poll(last [32]byte) [32]byte {
	data, err := readFile(w.Path)
	if err != nil {
		w.Log.Warn("secrets file unreadable; keeping the previous secrets", slog.String("error", err.Error()))
		if w.OnReload != nil {
			w.OnReload(false)
		}
		return last
	}
	if sha256.Sum256(data) == last {
		return last
	}
	set, err := Parse(data)
	if err != nil {
		// err names a ref and a rule, never a secret.
		w.Log.Warn("secrets file refused; keeping the previous secrets", slog.String("error", err.Error()))
		if w.OnReload != nil {
			w.OnReload(false)
		}
		// Remember the refused content so the same bad file is reported once.
		return sha256.Sum256(data)
	}
	w.Current.p.Store(set)
	w.Log.Info("secrets reloaded", slog.Int("refs", set.Len()))
	if w.OnReload != nil {
		w.OnReload(true)
	}
	return set.sum
}
