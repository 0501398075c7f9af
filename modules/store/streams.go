package store

import (
	"context"
	"database/sql"
	"errors"
)

// StreamState is what a producer resumes from.
type StreamState struct{ Cursor, ReplayFloor int64 }

const streamSQL = `
SELECT cursor, replay_floor FROM streams
WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3`

// Stream returns a stream's cursor and replay floor; a stream never written
// is all zeros, not an error.
func (s *Store) Stream(ctx context.Context, tenant, project, producer string) (StreamState, error) {
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
func (s *Store) SetReplayFloor(ctx context.Context, tenant, project, producer string, floor int64) (StreamState, error) {
	const op = "set replay floor"
	if !validIdentity(tenant, project, producer) || floor < 0 || floor > maxSequence {
		return StreamState{}, newErr(op, ErrInvalid)
	}
	var st StreamState
	var lowered bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := tx.QueryRowContext(ctx, lockStreamReturningSQL, tenant, project, producer).
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

// MaxReadLimit bounds ReadStream (the HTTP route allows 100).
const MaxReadLimit = 1000

// One snapshot for the cursor and the rows, so the page never runs past the
// cursor it reports. A payload past expires_at counts as expired even before
// the janitor deletes it.
const readStreamSQL = `
SELECT st.cursor, e.sequence, e.event_identity,
       CASE WHEN p.expires_at > now() THEN p.envelope END
FROM (SELECT coalesce(max(cursor), 0) AS cursor FROM streams
      WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3) st
LEFT JOIN LATERAL (
    SELECT sequence, event_identity FROM event_identities
    WHERE tenant_id = $1 AND project_id = $2 AND producer_id = $3
      AND sequence > $4::bigint AND sequence <= st.cursor
    ORDER BY sequence LIMIT $5
) e ON true
LEFT JOIN inbound_payloads p ON p.tenant_id = $1 AND p.event_identity = e.event_identity
ORDER BY e.sequence`

// ReadStream is the consumer read of contract §2: retained envelopes with
// after < sequence <= cursor in sequence order (at most limit), and the cursor.
func (s *Store) ReadStream(ctx context.Context, tenant, project, producer string, after int64, limit int) ([]StreamEnvelope, int64, error) {
	const op = "read stream"
	if !validIdentity(tenant, project, producer) || after < 0 || limit < 1 || limit > MaxReadLimit {
		return nil, 0, newErr(op, ErrInvalid)
	}
	rows, err := s.sqlDB().QueryContext(ctx, readStreamSQL, tenant, project, producer, after, limit)
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
