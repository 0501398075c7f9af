// Command testreceiver is the webhook consumer of the end-to-end tests: a
// small program a user could write with modules/receiver and its
// PostgreSQL receipts. Each verified delivery inserts one effect row (ids,
// outbound sequence, payload) in the receipt's transaction. With RX_CRASH_EVERY=N it kills itself (SIGKILL,
// so nothing is flushed or answered) right after committing the effect of
// every envelope whose sequence is a multiple of N, before answering: the
// worker then redelivers, and the receipt must keep the effect single.
//
// Environment: RX_ADDR (listen address), RX_DSN (its own database),
// RX_SECRET (whsec_…), RX_KEYS_URL and RX_TOKEN (the ingest API and a
// service credential for GET /v1/outbound-keys), RX_CRASH_EVERY.
package main

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/envelopeworker/envelopeworker/modules/receiver"
	"github.com/envelopeworker/envelopeworker/modules/receiver/pgreceipts"
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx := context.Background()
	crashEvery, _ := strconv.ParseInt(os.Getenv("RX_CRASH_EVERY"), 10, 64)
	pool, err := pgxpool.New(ctx, os.Getenv("RX_DSN"))
	if err != nil {
		return err
	}
	defer pool.Close()
	receipts, err := pgreceipts.New(pool, pgreceipts.Options{})
	if err != nil {
		return err
	}
	if err := receipts.CreateTable(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS rx_effects (webhook_id text NOT NULL, event_id text NOT NULL, sequence bigint NOT NULL, payload jsonb NOT NULL)`); err != nil {
		return err
	}
	keys := receiver.NewRemoteKeys(os.Getenv("RX_KEYS_URL"), os.Getenv("RX_TOKEN"), nil)
	if err := keys.Refresh(ctx); err != nil {
		return err
	}
	v, err := receiver.New(receiver.Config{Secrets: []string{os.Getenv("RX_SECRET")}, Keys: keys})
	if err != nil {
		return err
	}
	hook := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := receiver.FromContext(r.Context())
		dup, err := receipts.Handle(r.Context(), d.WebhookID, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO rx_effects VALUES ($1, $2, $3, $4)`, d.WebhookID, d.Envelope.EventID, d.Envelope.Sequence, string(d.Envelope.Payload))
			return err
		})
		if err != nil {
			receiver.Refuse(w, err)
			return
		}
		if !dup && crashEvery > 0 && d.Envelope.Sequence%crashEvery == 0 {
			// Committed, not answered.
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux := http.NewServeMux()
	mux.Handle("/hook", hook)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	srv := &http.Server{Addr: os.Getenv("RX_ADDR"), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
