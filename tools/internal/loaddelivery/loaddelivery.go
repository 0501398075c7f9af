// Package loaddelivery measures delivery-worker end to end: it seeds a
// backlog of outbox messages with ~1 KiB bodies, times a raw claim-and-settle
// loop over those rows (store.Claim of 100 then store.SettleBatch delivered:
// no HTTP, no signing, the ceiling the worker is compared with), puts the
// same rows back to pending, then starts delivery-worker processes (the
// built binary) against a loopback sink and times the drain. It reports
// rows/s for both and, for the worker, the due→sink-receipt latency
// percentiles of the backlog (every row becomes due at the same instant, so
// these describe draining a backlog, not an idle system's latency), and
// where the drain's CPU went, per message: the workers', its own (the
// sink's), the PostgreSQL server's (tools/internal/proccpu).
package loaddelivery

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/tools/internal/proccpu"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// Config is one run.
type Config struct {
	DatabaseURL  string        // admin DSN of a migrated database
	WorkerBin    string        // delivery-worker binary
	Workers      int           // worker processes
	Concurrency  int           // DELIVERY_CONCURRENCY of each
	TenantShare  int           // DELIVERY_TENANT_MAX_INFLIGHT of each (0: the worker's default)
	PollInterval time.Duration // DELIVERY_POLL_INTERVAL of each
	Messages     int           // backlog size
	PayloadBytes int           // body padding
	// SinkLatency is how long the sink holds each request before it
	// answers: an endpoint's own time (0: at once, a loopback sink).
	SinkLatency time.Duration
	Timeout     time.Duration // bound on the worker drain
	// WorkerLogLevel is LOG_LEVEL of each worker: "warn" keeps the drain
	// quiet; "info" adds the line a settled attempt logs, as in production.
	WorkerLogLevel string
	// ProfileDir, when set, receives the first worker's CPU profile of the
	// drain (worker-cpu.pprof, ProfileSeconds long, from the first receipt)
	// and, when the server has pg_stat_statements loaded, the statements of
	// the drain by total time (pg-statements.txt).
	ProfileDir     string
	ProfileSeconds int
}

// Report is what Run measured.
type Report struct {
	Messages        int     `json:"messages"`
	Workers         int     `json:"workers"`
	Concurrency     int     `json:"concurrency"`
	TenantShare     int     `json:"tenant_max_inflight"` // 0: the worker's default
	BodyBytes       int     `json:"body_bytes"`
	SinkLatencyMs   float64 `json:"sink_latency_ms"`
	RawRowsPerSec   float64 `json:"raw_rows_per_second"`
	WorkerPerSec    float64 `json:"worker_deliveries_per_second"`
	WorkerVsRaw     float64 `json:"worker_vs_raw"`
	LatencyP50ms    float64 `json:"latency_p50_ms"`
	LatencyP90ms    float64 `json:"latency_p90_ms"`
	LatencyP99ms    float64 `json:"latency_p99_ms"`
	LatencyMaxms    float64 `json:"latency_max_ms"`
	DuplicateHits   int     `json:"duplicate_receipts"`
	SinkMaxInFlight int     `json:"sink_max_in_flight"` // most requests the sink held at once
	DeliveredInDB   int     `json:"delivered_in_db"`
	LoadAverage1Min string  `json:"load_average_1m"`
	// CPU over the drain: from just before the worker processes start
	// (their start-up is in it, a few ms) to the last message settled
	// delivered in the database, before they are stopped. Absent where
	// /proc is not readable; postgres_cpu_us_per_message also where no
	// postgres process is on this machine. PostgreSQL's is the whole
	// server's: other load on it counts too.
	WorkerCPUPerMsg   float64 `json:"worker_cpu_us_per_message,omitempty"`   // the worker processes (/proc)
	SinkCPUPerMsg     float64 `json:"sink_cpu_us_per_message,omitempty"`     // this process: the sink and its bookkeeping (getrusage)
	PostgresCPUPerMsg float64 `json:"postgres_cpu_us_per_message,omitempty"` // every postgres process, reaped backends included
	CPUCoresBusy      float64 `json:"cpu_cores_busy,omitempty"`              // the three over the drain's wall time
}

// Main is the command line: flags, Run, one JSON line on stdout.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen-delivery", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c Config
	// No default from the environment: -h prints defaults, and a DSN can hold a password.
	fs.StringVar(&c.DatabaseURL, "database-url", "", "admin DSN of a migrated database (default $DATABASE_URL)")
	fs.StringVar(&c.WorkerBin, "worker-bin", "", "path of the built delivery-worker binary")
	fs.IntVar(&c.Workers, "workers", 1, "delivery-worker processes")
	fs.IntVar(&c.Concurrency, "concurrency", 200, "DELIVERY_CONCURRENCY of each worker")
	fs.IntVar(&c.TenantShare, "tenant-max-inflight", 0, "DELIVERY_TENANT_MAX_INFLIGHT of each worker (0: its default, a quarter of the concurrency)")
	fs.DurationVar(&c.PollInterval, "poll-interval", 10*time.Millisecond, "DELIVERY_POLL_INTERVAL of each worker (due tenants are listed again at most every min(this, 100ms))")
	fs.IntVar(&c.Messages, "messages", 20000, "backlog size")
	fs.IntVar(&c.PayloadBytes, "payload-bytes", 1000, "body padding (about 1 KiB bodies)")
	fs.DurationVar(&c.SinkLatency, "sink-latency", 0, "how long the sink holds each request before it answers (an endpoint's own time)")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Minute, "bound on the worker drain")
	fs.StringVar(&c.WorkerLogLevel, "worker-log-level", "warn", "LOG_LEVEL of each worker (info: one line per settled attempt, discarded)")
	fs.StringVar(&c.ProfileDir, "profile-dir", "", "write the first worker's CPU profile of the drain and the drain's pg_stat_statements here")
	fs.IntVar(&c.ProfileSeconds, "profile-seconds", 5, "CPU profile length (shorter than the drain)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = getenv("DATABASE_URL")
	}
	if c.DatabaseURL == "" || c.WorkerBin == "" || c.Workers < 1 || c.Concurrency < 1 || c.Messages < 2 || c.PayloadBytes < 0 || c.SinkLatency < 0 ||
		c.TenantShare < 0 || c.TenantShare > c.Concurrency || c.PollInterval <= 0 || c.ProfileSeconds < 1 || c.ProfileSeconds > 25 {
		fmt.Fprintln(stderr, "loadgen-delivery: --database-url, --worker-bin, --workers >= 1, --concurrency >= 1, --messages >= 2 are required; --tenant-max-inflight is 0 to --concurrency")
		return 2
	}
	rep, err := Run(ctx, c, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen-delivery:", err)
		return 1
	}
	b, _ := json.Marshal(rep)
	fmt.Fprintln(stdout, string(b))
	return 0
}

// sink answers 204 and records the first receipt time of each webhook-id
// and the most requests it held at once (one tenant: at most its share of
// each worker).
type sink struct {
	mu          sync.Mutex
	first       map[string]time.Time
	started     chan struct{} // closed at the first receipt
	startOnce   sync.Once
	dups        int
	want        int
	done        chan struct{}
	inFlight    int
	maxInFlight int
	latency     time.Duration // held before answering
}

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.inFlight++
	s.maxInFlight = max(s.maxInFlight, s.inFlight)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inFlight--
		s.mu.Unlock()
	}()
	_, _ = io.Copy(io.Discard, r.Body)
	now := time.Now()
	id := r.Header.Get("webhook-id")
	if s.started != nil {
		s.startOnce.Do(func() { close(s.started) })
	}
	s.mu.Lock()
	if _, ok := s.first[id]; ok {
		s.dups++
	} else {
		s.first[id] = now
		if len(s.first) == s.want {
			close(s.done)
		}
	}
	s.mu.Unlock()
	// Held after the receipt is timed: the latency figures stay due to
	// receipt, and the answer comes an endpoint's time later.
	if s.latency > 0 {
		t := time.NewTimer(s.latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
		t.Stop()
	}
	w.WriteHeader(http.StatusNoContent)
}

// Run seeds, runs the raw loop, resets, runs the workers and reports.
func Run(ctx context.Context, c Config, logw io.Writer) (Report, error) {
	st, err := store.Open(ctx, c.DatabaseURL, store.Options{MaxOpenConns: 16, ApplicationName: "loadgen-delivery"})
	if err != nil {
		return Report{}, fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	// The tool's own statements (resets, vacuums, counts, statistics) are
	// the benchmark's set-up, not the product's: they run on a pool of
	// their own, outside the store.
	db, err := sql.Open("pgx", c.DatabaseURL)
	if err != nil {
		return Report{}, fmt.Errorf("open database: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	tag := make([]byte, 4)
	_, _ = rand.Read(tag)
	tenant := "bench-" + hex.EncodeToString(tag)

	snk := &sink{first: map[string]time.Time{}, want: c.Messages, done: make(chan struct{}), started: make(chan struct{}),
		latency: c.SinkLatency}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Report{}, fmt.Errorf("sink listen: %w", err)
	}
	srv := &http.Server{Handler: snk, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	if _, err := st.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: tenant, ProjectID: "p1", Topic: "bench",
		URL: "http://" + ln.Addr().String() + "/hook", SecretRef: tenant}); err != nil { // a secret ref belongs to one tenant
		return Report{}, fmt.Errorf("add endpoint: %w", err)
	}
	fmt.Fprintf(logw, "seeding %d messages for %s\n", c.Messages, tenant)
	body, err := seed(ctx, st, tenant, c.Messages, c.PayloadBytes)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Messages: c.Messages, Workers: c.Workers, Concurrency: c.Concurrency, TenantShare: c.TenantShare, BodyBytes: body,
		SinkLatencyMs: float64(c.SinkLatency) / float64(time.Millisecond)}
	if err := vacuum(ctx, db); err != nil {
		return Report{}, err
	}

	fmt.Fprintln(logw, "raw claim-and-settle loop")
	rawStart := time.Now()
	n, err := rawLoop(ctx, st, tenant)
	if err != nil {
		return Report{}, err
	}
	if n != c.Messages {
		return Report{}, fmt.Errorf("raw loop settled %d of %d", n, c.Messages)
	}
	rep.RawRowsPerSec = float64(n) / time.Since(rawStart).Seconds()

	// The same rows, due again at one instant: the latency base. Their
	// attempt history goes too: the worker's attempts are numbered from 1
	// again and must each write their row, as on a first delivery.
	if _, err := db.ExecContext(ctx, `UPDATE outbox_messages SET status = 'pending', attempts = 0,
		next_attempt_at = now(), delivered_at = NULL, lease_expires_at = NULL, updated_at = now()
		WHERE tenant_id = $1`, tenant); err != nil {
		return Report{}, fmt.Errorf("reset rows: %w", err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM outbox_attempts WHERE tenant_id = $1`, tenant); err != nil {
		return Report{}, fmt.Errorf("reset attempts: %w", err)
	}
	if err := vacuum(ctx, db); err != nil {
		return Report{}, err
	}
	// The rows have been due since the reset; no worker ran before now.
	dueAt := time.Now()

	dir, err := os.MkdirTemp("", "loadgen-delivery")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("loadgen-delivery-secret-32bytes!"))
	secretsFile := filepath.Join(dir, "secrets.json")
	if err := os.WriteFile(secretsFile, []byte(`{"`+tenant+`":["`+secret+`"]}`), 0o600); err != nil {
		return Report{}, err
	}
	env := []string{
		"DATABASE_URL=" + c.DatabaseURL, "METRICS_ADDR=127.0.0.1:0", "WEBHOOK_SECRETS_FILE=" + secretsFile,
		"DELIVERY_ALLOW_INSECURE_LOOPBACK=true", "DELIVERY_CONCURRENCY=" + strconv.Itoa(c.Concurrency),
		"DELIVERY_LIMIT_TOKENS=1000000", "DELIVERY_LIMIT_INTERVAL=1s", "DELIVERY_POLL_INTERVAL=" + c.PollInterval.String(),
		"DB_MAX_OPEN_CONNS=8", "LOG_LEVEL=" + c.WorkerLogLevel, "PATH=" + os.Getenv("PATH"),
	}
	if c.TenantShare > 0 {
		env = append(env, "DELIVERY_TENANT_MAX_INFLIGHT="+strconv.Itoa(c.TenantShare))
	}
	var prof *profiler
	if c.ProfileDir != "" {
		if prof, err = newProfiler(ctx, db, c); err != nil {
			return Report{}, err
		}
		env = append(env, "PPROF_ENABLED=true")
	}
	// The drain's CPU window opens here: the workers do not exist yet.
	cpu0, cpuErr := proccpu.Take()
	fmt.Fprintf(logw, "starting %d worker(s)\n", c.Workers)
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
	}()
	for i := range c.Workers {
		p := exec.Command(c.WorkerBin)
		p.Env = env
		if i == 0 && prof != nil {
			p.Env = append(slices.Clone(env), "METRICS_ADDR="+prof.addr) // later entries win
		}
		p.Stdout, p.Stderr = logw, logw
		if c.WorkerLogLevel != "warn" && c.WorkerLogLevel != "error" {
			// A line per attempt: written (that is the cost measured), not shown.
			p.Stdout, p.Stderr = io.Discard, io.Discard
		}
		if err := p.Start(); err != nil {
			return Report{}, fmt.Errorf("start worker: %w", err)
		}
		procs = append(procs, p)
	}
	if prof != nil {
		go prof.cpuOnFirstReceipt(ctx, snk)
	}
	timer := time.NewTimer(c.Timeout)
	defer timer.Stop()
	select {
	case <-snk.done:
	case <-timer.C:
		return Report{}, fmt.Errorf("workers did not deliver %d messages within %v", c.Messages, c.Timeout)
	case <-ctx.Done():
		return Report{}, ctx.Err()
	}

	snk.mu.Lock()
	times := make([]time.Time, 0, len(snk.first))
	for _, t := range snk.first {
		times = append(times, t)
	}
	rep.DuplicateHits = snk.dups
	rep.SinkMaxInFlight = snk.maxInFlight
	snk.mu.Unlock()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	// From the first receipt to the last: process start-up is not delivery.
	rep.WorkerPerSec = float64(len(times)-1) / times[len(times)-1].Sub(times[0]).Seconds()
	rep.WorkerVsRaw = rep.WorkerPerSec / rep.RawRowsPerSec
	pct := func(p float64) float64 {
		i := min(len(times)-1, int(p*float64(len(times))))
		return float64(times[i].Sub(dueAt).Microseconds()) / 1000
	}
	rep.LatencyP50ms, rep.LatencyP90ms, rep.LatencyP99ms = pct(.50), pct(.90), pct(.99)
	rep.LatencyMaxms = float64(times[len(times)-1].Sub(dueAt).Microseconds()) / 1000

	// Settles commit after the receipt: wait (bounded) for the last ones,
	// briefly between counts, as the CPU window closes at the last.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox_messages WHERE tenant_id = $1 AND status = 'delivered'`,
			tenant).Scan(&rep.DeliveredInDB); err != nil {
			return Report{}, fmt.Errorf("count delivered: %w", err)
		}
		if rep.DeliveredInDB == c.Messages || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if cpuErr == nil {
		pids := make([]int, len(procs))
		for i, p := range procs {
			pids[i] = p.Process.Pid
		}
		var cpu1 proccpu.Mark
		if cpu1, cpuErr = proccpu.Take(pids...); cpuErr == nil {
			// The workers started inside the window: all their CPU is in it.
			worker, sink, pg := cpu1.Others, cpu1.Self-cpu0.Self, cpu1.Postgres-cpu0.Postgres
			if cpu1.PostgresProcs == 0 {
				pg = 0
			}
			rep.WorkerCPUPerMsg = proccpu.MicrosPer(worker, c.Messages)
			rep.SinkCPUPerMsg = proccpu.MicrosPer(sink, c.Messages)
			rep.PostgresCPUPerMsg = proccpu.MicrosPer(pg, c.Messages)
			rep.CPUCoresBusy = proccpu.Cores(worker+sink+pg, cpu1.At.Sub(cpu0.At))
		}
	}
	if cpuErr != nil {
		fmt.Fprintln(logw, "no CPU figures:", cpuErr)
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.LoadAverage1Min = strings.Fields(string(la))[0]
	}
	if prof != nil {
		if err := prof.finish(ctx, db); err != nil {
			return Report{}, err
		}
	}
	return rep, nil
}

// vacuum clears the dead row versions the previous phase left in the due
// index, as the store's own benchmark does, so both phases start from the
// same clean table (a drain still leaves dead versions behind as it goes,
// in both phases alike).
func vacuum(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, `VACUUM ANALYZE outbox_messages, outbox_attempts`); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	return nil
}

// seed enqueues n messages through store.Enqueue (8 at a time) and returns
// the body size.
func seed(ctx context.Context, st *store.Store, tenant string, n, pad int) (int, error) {
	padding := strings.Repeat("x", pad)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	var size int
	var once sync.Once
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				key := fmt.Sprintf("%s-%d", tenant, i)
				_, err := st.Outbox().Enqueue(ctx, store.Actor{TenantID: tenant, DeviceID: "svc1", CorrelationID: "seed"},
					store.EnqueueRequest{
						ProjectID: "p1", ProducerID: "svc1", Topic: "bench",
						IdempotencyDigest: sha256.Sum256([]byte(key)), RequestDigest: sha256.Sum256([]byte(key)),
						MaxAttempts: 12,
						Build: func(seq int64) ([]byte, string, error) {
							ident := sha256.Sum256([]byte(key))
							b := fmt.Appendf(nil, `{"event_id":%q,"sequence":%d,"payload":{"pad":%q}}`, key, seq, padding)
							once.Do(func() { size = len(b) })
							return b, hex.EncodeToString(ident[:]), nil
						},
					})
				if err != nil {
					errs <- fmt.Errorf("enqueue: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return size, nil
}

// rawLoop claims 100 and settles them delivered in one batch until nothing
// is due: the database work of delivery without HTTP or signing.
func rawLoop(ctx context.Context, st *store.Store, tenant string) (int, error) {
	total := 0
	for {
		claimed, err := st.Outbox().Claim(ctx, tenant, store.MaxClaim, 30*time.Second)
		if err != nil {
			return total, fmt.Errorf("raw claim: %w", err)
		}
		if len(claimed) == 0 {
			return total, nil
		}
		ss := make([]store.Settlement, len(claimed))
		for i, c := range claimed {
			ss[i] = store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered,
				StartedAt: time.Now(), Duration: time.Millisecond, HTTPStatus: http.StatusNoContent} // timed, as the worker settles
		}
		res, err := st.Outbox().SettleBatch(ctx, tenant, ss)
		if err != nil {
			return total, fmt.Errorf("raw settle: %w", err)
		}
		for _, e := range res {
			if e != nil {
				return total, fmt.Errorf("raw settle: %w", e)
			}
		}
		total += len(claimed)
	}
}
