package store

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
)

// StreamState is what a producer resumes from.
type StreamState struct{ Cursor, ReplayFloor int64 }

const streamSQL = `
SELECT cursor, replay_floor FROM streams
WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3`

// Stream returns a stream's cursor and replay floor; a stream never written
// is all zeros, not an error.
func (s *Inbound) Stream(ctx context.Context, tenant, project, producer string) (StreamState, error) {
	const op = "stream"
	if !validIdentity(tenant, project, producer) {
		return StreamState{}, newErr(op, ErrInvalid)
	}
	var st StreamState
	err := s.sqlDB().QueryRowContext(ctx, streamSQL, tenant, project, producer).Scan(&st.Cursor, &st.ReplayFloor)
	if errors.Is(err, sql.ErrNoRows) {
		return StreamState{}, nil
	}
	if err != nil {
		return StreamState{}, classify(ctx, op, err)
	}
	return st, nil
}

const lockStreamReturningSQL = lockStreamSQL + `
RETURNING cursor, replay_floor`

// raiseFloorSQL sets the floor and recomputes the cursor: everything <= the
// floor counts as settled, then the cursor runs through the retained
// sequences contiguous above max(cursor, floor) (same run test as decideSQL).
const raiseFloorSQL = `
WITH base AS (
    SELECT greatest(cursor, $4::bigint) AS b FROM streams
    WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3
)
UPDATE streams SET replay_floor = $4::bigint, updated_at = now(),
    cursor = base.b + (
        SELECT count(*) FROM (
            SELECT sequence - row_number() OVER (ORDER BY sequence) AS k
            FROM event_identities
            WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3 AND sequence > base.b
        ) run WHERE run.k = base.b)
FROM base
WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3
RETURNING cursor, replay_floor`

// SetReplayFloor raises a stream's replay floor (creating the stream if
// needed): sequences at or below it are refused as below_replay_floor and
// count as settled for the cursor. Lowering is ErrConflict (the current state
// is returned with it); setting the same floor again is a no-op.
func (s *Inbound) SetReplayFloor(ctx context.Context, tenant, project, producer string, floor int64) (StreamState, error) {
	const op = "set replay floor"
	if !validIdentity(tenant, project, producer) || floor < 0 || floor > maxSequence {
		return StreamState{}, newErr(op, ErrInvalid)
	}
	var st StreamState
	var lowered bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, lockStreamReturningStmt.text,
			lockStreamReturningStmt.bind(pgx.StrictNamedArgs{"tenant": tenant, "project": project, "producer": producer})).
			Scan(&st.Cursor, &st.ReplayFloor); err != nil {
			return err
		}
		if floor < st.ReplayFloor {
			lowered = true
			return nil
		}
		if floor == st.ReplayFloor {
			return nil
		}
		return tx.QueryRowContext(ctx, raiseFloorSQL, tenant, project, producer, floor).
			Scan(&st.Cursor, &st.ReplayFloor)
	})
	if err != nil {
		return StreamState{}, classify(ctx, op, err)
	}
	if lowered {
		return st, newErr(op+": floor may only rise", ErrConflict)
	}
	return st, nil
}

// StreamEnvelope is one retained envelope of a stream read.
type StreamEnvelope struct {
	Sequence       int64
	EventIdentity  string
	Envelope       []byte // canonical signed envelope; nil once the payload expired
	PayloadExpired bool
}

// One snapshot for the cursor and the rows, so the page never runs past the
// cursor it reports. A payload past expires_at counts as expired even before
// the janitor deletes it. The byte budget is applied here, by a running sum
// of octet_length (which reads the stored length, not the value), so rows
// past it never leave PostgreSQL and the caller never holds more than the
// budget plus one envelope. The first row always passes, and so does the
// lone row of a page without envelopes (sequence NULL), which carries the
// cursor. OFFSET 0 keeps the payload lookup a subquery run per envelope
// by its key: flattened, a plan made while the tables were empty read every
// payload of the tenant once per page (TestHotStatementPlansUseTheirKeys).
const readStreamSQL = `
SELECT cursor, sequence, event_identity, envelope FROM (
    SELECT st.cursor, e.sequence, e.event_identity, p.envelope,
           row_number() OVER w AS n,
           sum(coalesce(octet_length(p.envelope), 0)) OVER w AS upto
    FROM (SELECT coalesce(max(cursor), 0) AS cursor FROM streams
          WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3) st
    LEFT JOIN LATERAL (
        SELECT sequence, event_identity FROM event_identities
        WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3
          AND sequence > $4::bigint AND sequence <= st.cursor
        ORDER BY sequence LIMIT $5
    ) e ON true
    LEFT JOIN LATERAL (
        SELECT CASE WHEN expires_at > now() THEN envelope END AS envelope FROM inbound_payloads
        WHERE tenant_id = $1 AND event_identity = e.event_identity
        OFFSET 0
    ) p ON true
    WINDOW w AS (ORDER BY e.sequence)
) page
WHERE n = 1 OR upto <= $6::bigint
ORDER BY sequence`

// ReadStream is the consumer read of contract §2 and §8.2: retained
// envelopes with after < sequence <= cursor in sequence order, at most limit
// of them and, past the first, at most maxBytes of envelope bytes in all
// (an expired payload counts nothing), and the cursor. A reader continues
// with after = the last sequence it got.
func (s *Inbound) ReadStream(ctx context.Context, tenant, project, producer string, after int64, limit int, maxBytes int64) ([]StreamEnvelope, int64, error) {
	const op = "read stream"
	if !validIdentity(tenant, project, producer) || after < 0 || limit < 1 || limit > MaxReadLimit || maxBytes < 1 {
		return nil, 0, newErr(op, ErrInvalid)
	}
	rows, err := s.sqlDB().QueryContext(ctx, readStreamSQL, tenant, project, producer, after, limit, maxBytes)
	if err != nil {
		return nil, 0, classify(ctx, op, err)
	}
	defer rows.Close()
	var out []StreamEnvelope
	var cursor int64
	for rows.Next() {
		var seq sql.NullInt64
		var ev, env []byte
		if err := rows.Scan(&cursor, &seq, &ev, &env); err != nil {
			return nil, 0, classify(ctx, op, err)
		}
		if !seq.Valid {
			continue
		}
		out = append(out, StreamEnvelope{
			Sequence:       seq.Int64,
			EventIdentity:  hexIdentity(ev),
			Envelope:       env,
			PayloadExpired: env == nil,
		})
	}
	if err := rows.Err(); err != nil {
		return nil, 0, classify(ctx, op, err)
	}
	return out, cursor, nil
}
