// Package app wires ingest-api together: configuration, logger, store,
// server, the API and metrics listeners, and graceful shutdown. main only
// calls Run.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/modules/httpserve"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/config"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/server"
)

// Run serves until ctx is cancelled (SIGTERM in main), then shuts down in
// order: stop accepting and finish in-flight requests (up to
// SHUTDOWN_GRACE), commit what the group committer holds, close the pool.
// ready, if not nil, receives the bound API and metrics addresses once both
// listeners are up (tests bind ":0").
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, ready func(api, metrics net.Addr)) error {
	return run(ctx, args, getenv, stdout, ready, httpserve.DefaultTimeouts)
}

// run is Run with the listeners' timeouts (tests shorten them).
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer, ready func(api, metrics net.Addr), timeouts httpserve.Timeouts) error {
	cfg, err := config.Load(args, getenv, stdout) // -h is asked-for output: stdout
	if err != nil {
		return err
	}
	log := envflag.Logger(stdout, cfg.LogLevel) // LOG_LEVEL checked by config.Load

	st, err := store.Open(ctx, cfg.DatabaseURL, store.Options{MaxOpenConns: cfg.DBMaxOpenConns})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()

	// The keys file was checked by config; it is opened again here because
	// this is the copy that lives, and it may have changed in between.
	var keys outboundkeys.Source = outboundkeys.None{}
	var keysFile *outboundkeys.File
	if cfg.OutboundSigningKeysFile != "" {
		if keysFile, err = outboundkeys.OpenFile(cfg.OutboundSigningKeysFile); err != nil {
			return fmt.Errorf("OUTBOUND_SIGNING_KEYS_FILE: %w", err)
		}
		keys = keysFile
		log.Info("outbound signing keys loaded", slog.Int("tenants", keysFile.Tenants()))
	}

	// Off unless OTEL_* configure an exporter (see modules/telemetry).
	tracing, err := telemetry.Setup(ctx, "ingest-api", buildinfo.Get().Version, getenv)
	if err != nil {
		return err
	}
	// Deferred before the server exists, so it runs after srv.Close: every
	// request has ended its spans by then.
	defer tracing.ShutdownLogged(ctx, log)

	reg := server.NewRegistry()
	srv, err := server.New(server.Config{
		Tracing:                tracing,
		OutboundKeys:           keys,
		PayloadRetention:       cfg.PayloadRetention,
		ReplayWindow:           cfg.ReplayWindow,
		MaxSequenceAhead:       cfg.MaxSequenceAhead,
		SyncLimit:              limiter.Policy{Tokens: cfg.SyncLimitTokens, Interval: cfg.SyncLimitInterval},
		PeerLimit:              limiter.Policy{Tokens: cfg.PeerLimitTokens, Interval: cfg.PeerLimitInterval},
		OutboxLimit:            limiter.Policy{Tokens: cfg.OutboxLimitTokens, Interval: cfg.OutboxLimitInterval},
		TrustedProxies:         cfg.TrustedProxies,
		StoreTimeout:           cfg.StoreTimeout,
		MaxInflightBodyBytes:   cfg.MaxInflightBodyBytes,
		CredentialCacheTTL:     cfg.CredentialCacheTTL,
		GroupCommitWindow:      cfg.GroupCommitWindow,
		GroupCommitMaxItems:    cfg.GroupCommitMaxItems,
		GroupCommitConcurrency: cfg.GroupCommitConcurrency,
	}, st, log, reg)
	if err != nil {
		return err
	}

	apiLn, err := net.Listen("tcp", cfg.IngestAddr)
	if err != nil {
		_ = srv.Close(context.Background())
		return fmt.Errorf("listen %s: %w", cfg.IngestAddr, err)
	}
	metricsLn, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		_ = apiLn.Close()
		_ = srv.Close(context.Background())
		return fmt.Errorf("listen %s: %w", cfg.MetricsAddr, err)
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	api := timeouts.Server(srv.Handler(), errLog)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	metricsSrv := timeouts.Server(mux, errLog)

	// The reloader stops with ctx (SIGTERM) and is waited for below, so
	// nothing of it outlives Run.
	reloadCtx, stopReload := context.WithCancel(ctx)
	reloadDone := make(chan struct{})
	go func() {
		defer close(reloadDone)
		if keysFile != nil {
			keysFile.Run(reloadCtx, cfg.OutboundKeysReload, log)
		}
	}()
	defer func() { stopReload(); <-reloadDone }()

	serveErr := make(chan error, 2)
	go func() { serveErr <- api.Serve(apiLn) }()
	go func() { serveErr <- metricsSrv.Serve(metricsLn) }()
	log.Info("ingest-api listening", slog.String("addr", apiLn.Addr().String()), slog.String("metrics_addr", metricsLn.Addr().String()))
	if ready != nil {
		ready(apiLn.Addr(), metricsLn.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	}

	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownGrace)
	defer cancel()
	if err := api.Shutdown(shutdownCtx); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("api shutdown: %w", err))
	}
	// In-flight requests have been answered; the committer now has nothing
	// a client still waits for, but may hold items of requests whose
	// clients left: commit them before the pool closes.
	if err := srv.Close(shutdownCtx); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if err := metricsSrv.Shutdown(shutdownCtx); err != nil {
		runErr = errors.Join(runErr, fmt.Errorf("metrics shutdown: %w", err))
	}
	log.Info("stopped")
	return runErr
}
