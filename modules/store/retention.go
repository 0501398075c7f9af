package store

import (
	"context"
	"time"
)

// MaxDeleteBatch bounds one retention pass (contract §5).
const MaxDeleteBatch = 1000

// The janitor's role may select and delete payload rows and nothing else, and
// SELECT ... FOR UPDATE SKIP LOCKED needs UPDATE privilege, so the batch is
// chosen without row locks. Payload rows are never updated and only the
// janitor deletes them, so the only contention is between janitor replicas:
// a second replica picking the same rows waits for the first and deletes
// none of them. Oldest first keeps a backlog draining in order.
const deleteExpiredSQL = `
DELETE FROM inbound_payloads
WHERE (tenant_id, event_identity) IN (
    SELECT tenant_id, event_identity FROM inbound_payloads
    WHERE expires_at <= $1
    ORDER BY expires_at
    LIMIT $2)`

// DeleteExpiredPayloads deletes up to batch (1..MaxDeleteBatch) payloads whose
// expires_at is at or before now and reports how many went. It touches no
// other table: identities, sequences, cursors and audit rows stay.
func (s *Store) DeleteExpiredPayloads(ctx context.Context, now time.Time, batch int) (int, error) {
	const op = "delete expired payloads"
	if batch < 1 || batch > MaxDeleteBatch || now.IsZero() {
		return 0, newErr(op, ErrInvalid)
	}
	res, err := s.sqlDB().ExecContext(ctx, deleteExpiredSQL, now, batch)
	if err != nil {
		return 0, classify(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, classify(ctx, op, err)
	}
	return int(n), nil
}
