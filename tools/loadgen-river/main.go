// Command loadgen-river is the reference scripts/bench-delivery.sh compares
// delivery-worker with: River (github.com/riverqueue/river) working a
// backlog of jobs with about 1 KiB of arguments, on the same PostgreSQL,
// with as many workers as the delivery-worker has attempt slots. It inserts
// the backlog, vacuums as loadgen-delivery does, starts one client and
// reports, as one JSON line, the jobs completed per second from the first
// completion to the last (start-up is not work, as for the worker).
//
// With --work noop (the default) a job does nothing: the cost of the queue
// alone. With --work post a job does the HTTP work of a delivery attempt:
// it POSTs its encoded arguments, signed as the worker signs (Standard
// Webhooks, HMAC-SHA256), to a loopback sink in this process that answers
// 204 after --sink-latency. The difference between the two is the cost of
// the delivery itself. The sink runs in this process, so its CPU counts in
// River's figure (river_cpu_us_per_job), where for the worker it is
// reported apart.
//
// It is a module of its own, outside go.work, so that River and the pgx
// version it needs stay out of the services' dependency graph; build it with
// GOWORK=off.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type config struct {
	databaseURL  string
	jobs         int
	workers      int
	payloadBytes int
	poll         time.Duration
	maxConns     int
	timeout      time.Duration
	work         string        // noop or post
	sinkLatency  time.Duration // post: how long the sink waits before answering
}

type report struct {
	Jobs          int     `json:"jobs"`
	Workers       int     `json:"workers"`
	ArgsBytes     int     `json:"args_bytes"`
	Work          string  `json:"work"`                    // noop, or post: each job POSTs its args to the sink
	SinkLatencyMS float64 `json:"sink_latency_ms"`         // post: the sink's wait before answering (0 for noop: no sink)
	SinkReceipts  int64   `json:"sink_receipts,omitempty"` // post: requests the sink read (retries included)
	JobsPerSecond float64 `json:"river_jobs_per_second"`
	RiverVersion  string  `json:"river_version"`
	LoadAverage1m string  `json:"load_average_1m"`
	// CPU from the client's start to the last job completed, per job, as
	// loadgen-delivery reports the drain's (its comment says which
	// figures go absent when). PostgreSQL's is the whole server's.
	RiverCPUPerJob    float64 `json:"river_cpu_us_per_job,omitempty"`    // this process: River's client and workers, and in post mode the sink too (getrusage)
	PostgresCPUPerJob float64 `json:"postgres_cpu_us_per_job,omitempty"` // every postgres process, reaped backends included
	CPUCoresBusy      float64 `json:"cpu_cores_busy,omitempty"`          // the two over the window's wall time
}

// noopArgs pads a job's arguments to about the size of a webhook body.
type noopArgs struct {
	Pad string `json:"pad"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// postArgs are noopArgs under a kind of their own: the post mode's jobs.
type postArgs struct {
	Pad string `json:"pad"`
}

func (postArgs) Kind() string { return "post" }

// postWorker delivers each job's encoded arguments to url as the
// delivery-worker delivers a message's body (one attempt, no retry of its
// own: an error makes River retry, which a run must never need).
type postWorker struct {
	river.WorkerDefaults[postArgs]
	client *http.Client
	url    string
	key    []byte
}

func newPostWorker(url string, workers int) *postWorker {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	// As the worker's transport: one idle connection kept per attempt slot,
	// so no request waits for a dial once all are open.
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	return &postWorker{client: &http.Client{Transport: tr}, url: url, key: key}
}

func (w *postWorker) Work(ctx context.Context, job *river.Job[postArgs]) error {
	// The worker bounds an attempt with its context, not Client.Timeout.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body := job.EncodedArgs
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	id := strconv.FormatInt(job.ID, 10)
	ts := time.Now().Unix()
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", signature(w.key, id, ts, body))
	req.Header.Set("Idempotency-Key", id)
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	// Read to the end so the connection goes back to the idle pool.
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("sink answered %s", resp.Status)
	}
	return nil
}

// signature is a Standard Webhooks v1 webhook-signature value, as
// services/delivery-worker/internal/signer computes it for an HMAC secret
// (re-implemented: that module is outside this one's graph).
func signature(key []byte, id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write(strconv.AppendInt(nil, ts, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// sink is the post mode's loopback receiver: it reads each body whole,
// counts it, and answers 204 after its latency.
type sink struct {
	latency  time.Duration
	receipts atomic.Int64
	url      string
	srv      *http.Server
}

func startSink(latency time.Duration) (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("sink listen: %w", err)
	}
	s := &sink{latency: latency, url: "http://" + ln.Addr().String() + "/hook"}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *sink) Close() { _ = s.srv.Close() }

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.receipts.Add(1)
	if s.latency > 0 {
		t := time.NewTimer(s.latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done(): // the client gave up: nobody reads the answer
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen-river", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.databaseURL, "database-url", "", "admin DSN of a database River may migrate (default $DATABASE_URL)")
	fs.IntVar(&c.jobs, "jobs", 10000, "backlog size")
	fs.IntVar(&c.workers, "workers", 200, "River MaxWorkers (the delivery-worker's DELIVERY_CONCURRENCY)")
	fs.IntVar(&c.payloadBytes, "payload-bytes", 1000, "argument padding (about 1 KiB)")
	fs.DurationVar(&c.poll, "poll-interval", time.Second, "River FetchPollInterval (its default is 1s)")
	fs.IntVar(&c.maxConns, "max-conns", 8, "pool size (the delivery-worker's DB_MAX_OPEN_CONNS)")
	fs.DurationVar(&c.timeout, "timeout", 5*time.Minute, "bound on the drain")
	fs.StringVar(&c.work, "work", "noop", "what a job does: noop, or post (a signed POST of its args to a loopback sink in this process)")
	fs.DurationVar(&c.sinkLatency, "sink-latency", 0, "post: how long the sink waits before answering (noop ignores it)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if c.databaseURL == "" {
		c.databaseURL = os.Getenv("DATABASE_URL")
	}
	if c.databaseURL == "" || c.jobs < 2 || c.workers < 1 || c.payloadBytes < 0 || c.maxConns < 2 {
		fmt.Fprintln(stderr, "loadgen-river: --database-url, --jobs >= 2, --workers >= 1, --max-conns >= 2 are required")
		return 2
	}
	if (c.work != "noop" && c.work != "post") || c.sinkLatency < 0 {
		fmt.Fprintln(stderr, "loadgen-river: --work is noop or post, --sink-latency >= 0")
		return 2
	}
	rep, err := run(ctx, c, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen-river:", err)
		return 1
	}
	b, _ := json.Marshal(rep)
	fmt.Fprintln(stdout, string(b))
	return 0
}

func run(ctx context.Context, c config, logw io.Writer) (report, error) {
	pcfg, err := pgxpool.ParseConfig(c.databaseURL)
	if err != nil {
		return report{}, fmt.Errorf("database url: %w", err)
	}
	pcfg.MaxConns = int32(c.maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return report{}, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return report{}, fmt.Errorf("migrator: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return report{}, fmt.Errorf("migrate: %w", err)
	}

	workers := river.NewWorkers()
	var args river.JobArgs = noopArgs{Pad: strings.Repeat("x", c.payloadBytes)}
	var snk *sink
	if c.work == "post" {
		if snk, err = startSink(c.sinkLatency); err != nil {
			return report{}, err
		}
		defer snk.Close() // after the client's Stop, deferred below
		river.AddWorker(workers, newPostWorker(snk.url, c.workers))
		args = postArgs{Pad: strings.Repeat("x", c.payloadBytes)}
	} else {
		river.AddWorker(workers, noopWorker{})
	}
	client, err := river.NewClient(driver, &river.Config{
		Logger:            slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: c.workers}},
		Workers:           workers,
		FetchPollInterval: c.poll,
		FetchCooldown:     min(c.poll, 100*time.Millisecond),
	})
	if err != nil {
		return report{}, fmt.Errorf("client: %w", err)
	}

	argsJSON, _ := json.Marshal(args)
	fmt.Fprintf(logw, "inserting %d jobs\n", c.jobs)
	for done := 0; done < c.jobs; {
		n := min(1000, c.jobs-done)
		params := make([]river.InsertManyParams, n)
		for i := range params {
			params[i] = river.InsertManyParams{Args: args}
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return report{}, fmt.Errorf("insert: %w", err)
		}
		done += n
	}
	// As loadgen-delivery does before each timed phase.
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE river_job`); err != nil {
		return report{}, fmt.Errorf("vacuum: %w", err)
	}

	events, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{Kinds: []river.EventKind{river.EventKindJobCompleted}, ChanSize: c.jobs})
	defer cancelSub()
	cpu0, cpuErr := Take() // this process and the PostgreSQL server (proccpu.go)
	if err := client.Start(ctx); err != nil {
		return report{}, fmt.Errorf("start: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	}()
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	var first, last time.Time
	for n := 0; n < c.jobs; {
		select {
		case ev := <-events:
			if ev == nil {
				return report{}, errors.New("subscription closed early")
			}
			last = time.Now()
			if n == 0 {
				first = last
			}
			n++
		case <-timer.C:
			return report{}, fmt.Errorf("river did not complete %d jobs within %v", c.jobs, c.timeout)
		case <-ctx.Done():
			return report{}, ctx.Err()
		}
	}
	var cpu1 Mark
	if cpuErr == nil {
		cpu1, cpuErr = Take()
	}
	rep := report{Jobs: c.jobs, Workers: c.workers, ArgsBytes: len(argsJSON), Work: c.work,
		JobsPerSecond: float64(c.jobs-1) / last.Sub(first).Seconds(), RiverVersion: riverVersion()}
	if snk != nil {
		rep.SinkLatencyMS = float64(c.sinkLatency) / float64(time.Millisecond)
		rep.SinkReceipts = snk.receipts.Load()
		if rep.SinkReceipts < int64(c.jobs) {
			return report{}, fmt.Errorf("the sink read %d requests for %d completed jobs", rep.SinkReceipts, c.jobs)
		}
	}
	if cpuErr == nil {
		own, pg := cpu1.Self-cpu0.Self, cpu1.Postgres-cpu0.Postgres
		if cpu1.PostgresProcs == 0 {
			pg = 0
		}
		rep.RiverCPUPerJob = MicrosPer(own, c.jobs)
		rep.PostgresCPUPerJob = MicrosPer(pg, c.jobs)
		rep.CPUCoresBusy = Cores(own+pg, cpu1.At.Sub(cpu0.At))
	} else {
		fmt.Fprintln(logw, "no CPU figures:", cpuErr)
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		rep.LoadAverage1m = strings.Fields(string(la))[0]
	}
	return rep, nil
}

func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "unknown"
}
