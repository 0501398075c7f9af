package receiver

import (
	"context"
	"net/http"
)

// Receipts records which webhook ids took effect, in the same transaction
// as the effect, so a redelivery (the sender retries until it sees a 2xx)
// never takes effect twice. Tx is the implementation's transaction type
// (pgreceipts: pgx.Tx).
type Receipts[Tx any] interface {
	// Handle inserts the receipt of webhookID and runs effect in one
	// transaction. For a webhook id already received it runs nothing and
	// answers duplicate. An error from effect rolls everything back.
	Handle(ctx context.Context, webhookID string, effect func(ctx context.Context, tx Tx) error) (duplicate bool, err error)
}

// Effect is the handler's work for one verified delivery, done inside the
// receipt's transaction.
type Effect[Tx any] func(ctx context.Context, tx Tx, d *Delivery) error

// Handler verifies each delivery, then records its receipt and runs effect
// in one transaction: 204 when it committed or was already received, the
// refusal otherwise. The effect sees only verified deliveries.
func Handler[Tx any](v *Verifier, rc Receipts[Tx], effect Effect[Tx]) http.Handler {
	return v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := FromContext(r.Context())
		_, err := rc.Handle(r.Context(), d.WebhookID, func(ctx context.Context, tx Tx) error {
			return effect(ctx, tx, d)
		})
		if err != nil {
			Refuse(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
}
