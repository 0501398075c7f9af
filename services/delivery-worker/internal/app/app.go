// Package app wires delivery-worker together: configuration, logger, store,
// secrets watcher, limiter, sender, worker, the metrics/health listener and
// graceful shutdown. main only calls Run.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/modules/httpserve"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/config"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/sender"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/worker"
)

// backoffJitter is the largest fraction taken off a retry delay.
const backoffJitter = 0.2

// Run delivers until ctx is cancelled (SIGTERM in main), then stops claiming,
// lets in-flight attempts finish within SHUTDOWN_GRACE, and closes
// everything. ready, if not nil, receives the bound metrics address once the
// listener is up (tests bind ":0").
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, ready func(metrics net.Addr)) error {
	return run(ctx, args, getenv, stdout, ready, httpserve.DefaultTimeouts)
}

// run is Run with the listener's timeouts (tests shorten them).
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, ready func(metrics net.Addr), timeouts httpserve.Timeouts) error {
	cfg, err := config.Load(args, getenv, stdout) // -h is asked-for output: stdout
	if err != nil {
		return err
	}
	log := envflag.Logger(stdout, cfg.LogLevel) // LOG_LEVEL checked by config.Load

	set, err := secrets.Load(cfg.WebhookSecretsFile)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	current := secrets.NewCurrent(set)

	st, err := store.Open(ctx, cfg.DatabaseURL, store.Options{MaxOpenConns: cfg.DBMaxOpenConns, ApplicationName: "delivery-worker",
		OutboxPayloadRetention: cfg.OutboxPayloadRetention})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()

	lim, err := limiter.New[limiter.DeliveryKey](limiter.Policy{Tokens: cfg.LimitTokens, Interval: cfg.LimitInterval})
	if err != nil {
		return fmt.Errorf("delivery limiter: %w", err)
	}
	defer lim.Close(context.WithoutCancel(ctx))

	snd := sender.New(sender.Config{
		Timeout:       cfg.HTTPTimeout,
		AllowLoopback: cfg.AllowInsecureLoopback,
		Backoff:       sender.Backoff{Base: cfg.BackoffBase, Cap: cfg.BackoffMax, Jitter: backoffJitter},
		Secrets:       current.Lookup,
		// Every attempt slot may hold a connection to the same endpoint.
		IdleConnsPerHost: cfg.Concurrency,
	})
	defer snd.Close()

	// Off unless OTEL_* configure an exporter (see modules/telemetry).
	tracing, err := telemetry.Setup(ctx, "delivery-worker", buildinfo.Get().Version, getenv)
	if err != nil {
		return err
	}
	// Deferred first, so it runs last: after the worker's in-flight attempts
	// ended their spans.
	defer tracing.ShutdownLogged(ctx, log)

	reg := worker.NewRegistry()
	m := worker.NewMetrics(reg)
	w, err := worker.New(worker.Config{
		Lease:             cfg.Lease,
		Concurrency:       cfg.Concurrency,
		TenantMaxInflight: cfg.TenantMaxInflight,
		ClaimMax:          cfg.ClaimSize,
		PollInterval:      cfg.PollInterval,
		Grace:             cfg.ShutdownGrace,
		StoreTimeout:      cfg.StoreTimeout,
		StatsInterval:     15 * time.Second,
		Tracing:           tracing,
	}, cfg.HTTPTimeout, st.Outbox(), snd, lim, log, m)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) {
		writeJSON(rw, http.StatusOK, "ok")
	})
	schema := store.NewReadiness(st, store.ReadinessConfig{Need: migrations.Latest(), Timeout: cfg.StoreTimeout})
	mux.HandleFunc("GET /readyz", readyz(schema, log))
	if cfg.PprofEnabled {
		mountPprof(mux)
	}
	srv := timeouts.Server(mux, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("delivery-worker started", slog.String("metrics_addr", ln.Addr().String()),
		slog.Bool("allow_insecure_loopback", cfg.AllowInsecureLoopback), slog.Int("secret_refs", set.Len()))
	if ready != nil {
		ready(ln.Addr())
	}

	// The worker and the secrets watcher stop with runCtx: SIGTERM, or the
	// metrics listener failing.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		watcher := &secrets.Watcher{Path: cfg.WebhookSecretsFile, Interval: cfg.SecretsReloadInterval,
			Current: current, Log: log, OnReload: m.SecretReload}
		_ = watcher.Run(runCtx)
	}()
	go func() {
		defer wg.Done()
		if awaitSchema(runCtx, schema, log) == nil {
			_ = w.Run(runCtx)
		}
	}()

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		runErr = fmt.Errorf("metrics server: %w", err)
	}
	stop()
	wg.Wait() // the worker honours SHUTDOWN_GRACE itself

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		runErr = errors.Join(runErr, fmt.Errorf("metrics shutdown: %w", err))
	}
	log.Info("stopped")
	return runErr
}

// awaitSchema returns nil once the schema is not older than this build's, or
// ctx's error. A rollout starts a new worker (a surge pod) before its
// release's migrate Job may have run, and unlike ingest-api, which gets no
// traffic while unready, the worker would claim and settle at once: it waits
// instead, so no statement of this release meets the previous release's
// schema. An unreachable database does not hold it back; the loop handles an
// outage as it always has.
func awaitSchema(ctx context.Context, schema *store.Readiness, log *slog.Logger) error {
	waiting := false
	for {
		err := schema.Check(ctx)
		if !errors.Is(err, store.ErrSchemaBehind) {
			if waiting && ctx.Err() == nil {
				log.Info("schema migrated; claiming")
			}
			return ctx.Err()
		}
		if !waiting {
			log.Warn("claiming nothing until envctl migrate has run", slog.String("error", err.Error()))
			waiting = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func writeJSON(rw http.ResponseWriter, status int, state string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_ = json.NewEncoder(rw).Encode(map[string]string{"status": state})
}

// readyz: the database answers and its schema is at or above the version
// this build needs (contract §8.1: a later release's migration never makes
// this one unready), from a probe shared by every caller and at most a
// second old. The body never carries driver text.
func readyz(ready *store.Readiness, log *slog.Logger) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		if err := ready.Check(r.Context()); err != nil {
			log.Warn("not ready", slog.String("error", err.Error()))
			writeJSON(rw, http.StatusServiceUnavailable, "unavailable")
			return
		}
		writeJSON(rw, http.StatusOK, "ready")
	}
}
