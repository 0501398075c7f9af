package chaos

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
)

// Fault kinds, as counted in the report.
const (
	FaultKillIngest         = "kill_ingest"
	FaultKillWorker         = "kill_worker"
	FaultPGRestartFast      = "pg_restart_fast"
	FaultPGRestartImmediate = "pg_restart_immediate"
	FaultPGTerminate        = "pg_terminate_backend"
	FaultProxyLatency       = "proxy_latency"
	FaultProxyStall         = "proxy_stall"
	FaultProxyReset         = "proxy_reset"
	FaultSinkStall          = "sink_stall"
	FaultSinkReset          = "sink_reset"
	FaultSinkSlow           = "sink_slow"
	FaultSink500            = "sink_500"
	FaultSink429            = "sink_429_retry_after"
	FaultSinkFlap           = "sink_flap"
)

// AllFaults is every kind, in report order.
var AllFaults = []string{
	FaultKillIngest, FaultKillWorker,
	FaultPGRestartFast, FaultPGRestartImmediate, FaultPGTerminate,
	FaultProxyLatency, FaultProxyStall, FaultProxyReset,
	FaultSinkStall, FaultSinkReset, FaultSinkSlow, FaultSink500, FaultSink429, FaultSinkFlap,
}

// rig is everything a fault acts on in one scenario.
type rig struct {
	cluster *Cluster
	admin   *sql.DB // the scenario's database, as its owner, not through a proxy
	proxies []*toxiproxy.Proxy
	ingest  []*Replica
	workers []*Replica
	sink    *Sink

	mu     sync.Mutex
	rnd    *rand.Rand
	counts map[string]int
	// busy serializes faults on the same target when two injectors run at once.
	busy map[any]bool
}

func (r *rig) intn(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rnd.IntN(n)
}

func (r *rig) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.intn(int(hi-lo)+1))
}

// take marks target busy; false when another injector holds it.
func (r *rig) take(target any) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy[target] {
		return false
	}
	r.busy[target] = true
	return true
}

func (r *rig) release(target any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.busy, target)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// inject applies one fault of kind and undoes it before returning (a killed process runs again, a
// toxic is removed, the sink is healthy). The window it holds a fault open ends early with ctx, but
// the undo always runs. It reports whether the fault was applied (false when its target was busy).
func (r *rig) inject(ctx context.Context, kind string) (bool, error) {
	// Undo work must finish even when the fault phase has just ended.
	undo := context.WithoutCancel(ctx)
	switch kind {
	case FaultKillIngest, FaultKillWorker:
		reps := r.ingest
		if kind == FaultKillWorker {
			reps = r.workers
		}
		rep := reps[r.intn(len(reps))]
		if !r.take(rep) {
			return false, nil
		}
		defer r.release(rep)
		rep.Kill()
		sleepCtx(ctx, r.between(100*time.Millisecond, 800*time.Millisecond))
		if err := rep.Start(undo, 60*time.Second); err != nil {
			return true, fmt.Errorf("restart after SIGKILL: %w", err)
		}
	case FaultPGRestartFast, FaultPGRestartImmediate:
		if !r.take(r.cluster) {
			return false, nil
		}
		defer r.release(r.cluster)
		mode := strings.TrimPrefix(kind, "pg_restart_")
		if err := r.cluster.Restart(undo, mode); err != nil {
			return true, fmt.Errorf("restart PostgreSQL (%s): %w", mode, err)
		}
	case FaultPGTerminate:
		if !r.take(r.cluster) {
			return false, nil
		}
		defer r.release(r.cluster)
		qctx, cancel := context.WithTimeout(undo, 5*time.Second)
		defer cancel()
		// Random client sessions of this database: the binaries' pools (and a killed one's leftovers).
		_, err := r.admin.ExecContext(qctx, `
SELECT pg_terminate_backend(pid) FROM (
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
    ORDER BY random() LIMIT $1) s`, 1+r.intn(6))
		if err != nil {
			// The server may be restarting under another injector; nothing was terminated then.
			return false, nil //nolint:nilerr // not a fault of the system under test
		}
	case FaultProxyLatency, FaultProxyStall, FaultProxyReset:
		p := r.proxies[r.intn(len(r.proxies))]
		if !r.take(p) {
			return false, nil
		}
		defer r.release(p)
		var toxic string
		window := r.between(700*time.Millisecond, 2*time.Second)
		switch kind {
		case FaultProxyLatency:
			// Both ways, so queries and their answers (claims, settles) arrive late; past a
			// lease, a settle is stale by the time it lands.
			lat := r.between(200*time.Millisecond, 1500*time.Millisecond).Milliseconds()
			toxic = fmt.Sprintf(`{"name":"chaos","type":"latency","stream":"%s","toxicity":1,"attributes":{"latency":%d,"jitter":%d}}`,
				[]string{"upstream", "downstream"}[r.intn(2)], lat, lat/4)
		case FaultProxyStall:
			// Nothing gets through; removing the toxic closes the stalled connections.
			toxic = `{"name":"chaos","type":"timeout","stream":"upstream","toxicity":1,"attributes":{"timeout":0}}`
		case FaultProxyReset:
			// Every connection that sends anything is reset (TCP RST).
			toxic = `{"name":"chaos","type":"reset_peer","stream":"upstream","toxicity":1,"attributes":{"timeout":0}}`
			window = r.between(200*time.Millisecond, 800*time.Millisecond)
		}
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			return false, fmt.Errorf("add toxic: %w", err)
		}
		sleepCtx(ctx, window)
		if err := p.Toxics.RemoveToxic(undo, "chaos"); err != nil {
			return true, fmt.Errorf("remove toxic: %w", err)
		}
	case FaultSinkStall, FaultSinkReset, FaultSinkSlow, FaultSink500, FaultSink429, FaultSinkFlap:
		if !r.take(r.sink) {
			return false, nil
		}
		defer r.release(r.sink)
		window := r.between(500*time.Millisecond, 1500*time.Millisecond)
		if kind == FaultSinkFlap {
			if err := r.sink.Flap(ctx, r.between(300*time.Millisecond, 1500*time.Millisecond)); err != nil && ctx.Err() == nil {
				return true, err
			}
			break
		}
		r.sink.SetMode(map[string]SinkMode{
			FaultSinkStall: SinkStall, FaultSinkReset: SinkReset, FaultSinkSlow: SinkSlow,
			FaultSink500: Sink500, FaultSink429: Sink429,
		}[kind])
		sleepCtx(ctx, window)
		r.sink.SetMode(SinkHealthy)
	default:
		return false, fmt.Errorf("chaos: unknown fault %q", kind)
	}
	r.mu.Lock()
	r.counts[kind]++
	r.mu.Unlock()
	return true, nil
}

// injectLoop applies faults from kinds (in turn, or at random when random) until ctx ends, pausing
// 0.2–0.6s between them. The first error ends it.
func (r *rig) injectLoop(ctx context.Context, kinds []string, random bool) error {
	for i := 0; ctx.Err() == nil; i++ {
		kind := kinds[i%len(kinds)]
		if random {
			kind = kinds[r.intn(len(kinds))]
		}
		if _, err := r.inject(ctx, kind); err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		sleepCtx(ctx, r.between(200*time.Millisecond, 600*time.Millisecond))
	}
	return nil
}
