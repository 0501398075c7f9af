package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// CheckSchema reports whether the database answers and its schema is at or
// above need, the migration version the caller was built for (a binary
// passes migrations.Latest() of the migrations module it links). It returns
// nil when ready, ErrSchemaBehind (wrapped, with both versions, which are
// ours and safe to log) when the schema is older, and the *Error of the
// failed read otherwise: ErrUnavailable when the database is unreachable or
// timed out, ErrInternal when it answered with an error (for example a role
// without SELECT on schema_migrations).
func (s *Store) CheckSchema(ctx context.Context, need int) error {
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if v < need {
		return fmt.Errorf("%w: database at version %d, this build needs %d (run envctl migrate)", ErrSchemaBehind, v, need)
	}
	return nil
}

// ReadinessConfig tunes a Readiness. Zero values take the defaults noted.
type ReadinessConfig struct {
	// Need is the schema version the binary was built for (migrations.Latest()).
	Need int
	// MaxAge is how long a probe's result answers callers, counted from the
	// probe's start, so no answer describes the database as it was more than
	// MaxAge ago. Default 1s.
	MaxAge time.Duration
	// Timeout bounds one probe. Default 5s.
	Timeout time.Duration
	// Now is the clock; tests fix it. Default time.Now.
	Now func() time.Time
}

// Readiness answers readiness checks from a shared, recent CheckSchema probe,
// so an endpoint anyone can call (ingest-api serves /readyz on its public
// port) costs the database at most one probe per MaxAge, however often it
// is called. At most one probe runs at a time; callers that arrive while it
// runs wait for its result. Failures are cached exactly as long as
// successes, so a recovered database is seen within MaxAge.
//
// The probe runs on the first caller's context values but not its
// cancellation: a client that hangs up must not turn the result every
// waiting caller shares into a failure. A caller whose own context ends
// stops waiting (ErrUnavailable) without disturbing the probe.
type Readiness struct {
	st  *Store
	cfg ReadinessConfig

	mu      sync.Mutex
	started time.Time     // start of the probe that set err; zero before the first
	err     error         // its result
	running chan struct{} // closed when the probe in flight ends; nil when none runs
	probes  atomic.Uint64
}

// NewReadiness builds a Readiness over st.
func NewReadiness(st *Store, cfg ReadinessConfig) *Readiness {
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Readiness{st: st, cfg: cfg}
}

// Check returns the result of a probe that started at most MaxAge ago (see
// CheckSchema for the errors), running one when there is none.
func (r *Readiness) Check(ctx context.Context) error {
	r.mu.Lock()
	if !r.started.IsZero() && r.cfg.Now().Sub(r.started) < r.cfg.MaxAge {
		err := r.err
		r.mu.Unlock()
		return err
	}
	done := r.running
	lead := done == nil
	if lead {
		done = make(chan struct{})
		r.running = done
	}
	r.mu.Unlock()

	if lead {
		r.probe(ctx, done)
	} else {
		select {
		case <-done:
		case <-ctx.Done():
			return classify(ctx, "readiness", ctx.Err())
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// probe runs one CheckSchema and publishes its result; done is closed even
// if the check panics, so waiters never hang.
func (r *Readiness) probe(ctx context.Context, done chan struct{}) {
	start := r.cfg.Now()
	err := errProbeUnfinished
	defer func() {
		r.mu.Lock()
		r.started, r.err, r.running = start, err, nil
		r.mu.Unlock()
		close(done)
	}()
	r.probes.Add(1)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	err = r.st.CheckSchema(pctx, r.cfg.Need)
}

// Probes is how many probes have run: what the checks cost the database.
func (r *Readiness) Probes() uint64 { return r.probes.Load() }
