package store

import (
	"context"
	"time"
)

// The janitor's role may select and delete payload rows and nothing else, and
// SELECT ... FOR UPDATE SKIP LOCKED needs UPDATE privilege, so the batch is
// chosen without row locks. Payload rows are never updated and only the
// janitor deletes them, so the only contention is between janitor replicas:
// a second replica picking the same rows waits for the first and deletes
// none of them. Oldest first keeps a backlog draining in order.
//
// The batch is found by physical address (ctid), not by primary key: event
// identities are hashes, so a key lookup per row lands on a random leaf of
// the primary-key index, and those reads and comparisons were most of a
// batch's work (EXPLAIN: about 530 buffers per 100 rows by key, 250 by ctid;
// docs/benchmarks.md). A ctid the subquery returns names the same row for
// the whole statement: the row is live in the statement's snapshot, so no
// VACUUM can free its slot for a new row until the statement ends; a row
// another janitor deleted meanwhile is waited for and skipped. That holds for
// one statement on one heap only: split into a select and a delete, a freed
// slot could hold a new live row by the time of the delete, and on a
// partitioned or inherited table one ctid names a row in every partition.
// So the statement names one heap: the table in the plain layout, each
// partition in turn in the partitioned one (partitions.go, which refuses any
// other shape). The repeated expires_at check keeps even a mistake from
// deleting a live row.
func deleteExpiredPayloadsSQL(heap string) string {
	return `
DELETE FROM ` + heap + `
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM ` + heap + `
    WHERE expires_at <= $1
    ORDER BY expires_at
    LIMIT $2))
  AND expires_at <= $1`
}

var deleteExpiredSQL = deleteExpiredPayloadsSQL("inbound_payloads")

// DeleteExpiredPayloads deletes up to batch (1..MaxDeleteBatch) payloads whose
// expires_at is at or before now and reports how many went. It touches no
// other table: identities, sequences, cursors and audit rows stay.
func (s *Retention) DeleteExpiredPayloads(ctx context.Context, now time.Time, batch int) (int, error) {
	const op = "delete expired payloads"
	if batch < 1 || batch > MaxDeleteBatch || now.IsZero() {
		return 0, newErr(op, ErrInvalid)
	}
	groups, err := s.partitions(ctx, "inbound_payloads")
	if err != nil {
		return 0, classify(ctx, op, err)
	}
	if groups == nil {
		n, err := s.execCount(ctx, deleteExpiredSQL, now, batch)
		if err != nil {
			return 0, classify(ctx, op, err)
		}
		return n, nil
	}
	// Partition by partition, one statement each, until the batch is full:
	// 0 still means nothing is due anywhere. Oldest first holds within a
	// partition; the first partition visited rotates.
	total := 0
	for _, g := range s.sweepOrder(groups) {
		n, err := s.execCount(ctx, deleteExpiredPayloadsSQL(g["inbound_payloads"]), now, batch-total)
		if err != nil {
			return total, classify(ctx, op, err)
		}
		if total += n; total == batch {
			break
		}
	}
	return total, nil
}
