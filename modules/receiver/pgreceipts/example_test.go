package pgreceipts_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/envelopeworker/envelopeworker/modules/receiver"
	"github.com/envelopeworker/envelopeworker/modules/receiver/pgreceipts"
)

// An endpoint whose effect (here: one row per event) commits with its
// receipt, so a redelivery after a crash between the commit and the answer
// answers 204 without doing it again.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@db.example.test/app")
	if err != nil {
		log.Fatal(err)
	}
	receipts, err := pgreceipts.New(pool, pgreceipts.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := receipts.CreateTable(ctx); err != nil {
		log.Fatal(err)
	}
	keys := receiver.NewRemoteKeys("https://ingest.example.test", "<service credential>", nil)
	v, err := receiver.New(receiver.Config{Secrets: []string{"whsec_…"}, Keys: keys})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/hooks/proposals", receiver.Handler[pgx.Tx](v, receipts,
		func(ctx context.Context, tx pgx.Tx, d *receiver.Delivery) error {
			_, err := tx.Exec(ctx, `INSERT INTO proposals (event_id, body) VALUES ($1, $2)`,
				d.Envelope.EventID, d.Envelope.Payload)
			return err
		}))
	// Prune receipts older than the replay window, e.g. hourly:
	// n, err := receipts.Prune(ctx)
	log.Fatal(http.ListenAndServe(":8443", nil))
}
