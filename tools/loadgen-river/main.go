// Command loadgen-river is the reference scripts/bench-delivery.sh compares
// delivery-worker with: River (github.com/riverqueue/river) working a
// backlog of no-op jobs with about 1 KiB of arguments, on the same
// PostgreSQL, with as many workers as the delivery-worker has attempt slots.
// It inserts the backlog, vacuums as loadgen-delivery does, starts one
// client and reports, as one JSON line, the jobs completed per second from
// the first completion to the last (start-up is not work, as for the
// worker).
//
// It is a module of its own, outside go.work, so that River and the pgx
// version it needs stay out of the services' dependency graph; build it with
// GOWORK=off.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
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
}

type report struct {
	Jobs          int     `json:"jobs"`
	Workers       int     `json:"workers"`
	ArgsBytes     int     `json:"args_bytes"`
	JobsPerSecond float64 `json:"river_jobs_per_second"`
	RiverVersion  string  `json:"river_version"`
	LoadAverage1m string  `json:"load_average_1m"`
	// CPU from the client's start to the last job completed, per job, as
	// loadgen-delivery reports the drain's (its comment says which
	// figures go absent when). PostgreSQL's is the whole server's.
	RiverCPUPerJob    float64 `json:"river_cpu_us_per_job,omitempty"`    // this process: River's client and workers (getrusage)
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
	river.AddWorker(workers, noopWorker{})
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

	args := noopArgs{Pad: strings.Repeat("x", c.payloadBytes)}
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
	rep := report{Jobs: c.jobs, Workers: c.workers, ArgsBytes: len(argsJSON),
		JobsPerSecond: float64(c.jobs-1) / last.Sub(first).Seconds(), RiverVersion: riverVersion()}
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
