package store

import (
	"context"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Outcome is the public outcome of contract §2.
type Outcome string

const (
	OutcomeAccepted  Outcome = "accepted"
	OutcomeDuplicate Outcome = "duplicate"
	OutcomeRefused   Outcome = "refused"
	// OutcomeStale is no answer: the input named the public key it was
	// verified with (IngestInput.VerifiedWith), and at commit that key was no
	// longer active with that public key. Nothing was written, not even an
	// audit row; the caller decides again from a fresh key lookup.
	OutcomeStale Outcome = "stale"
)

// Reasons decided at step 5.
const (
	ReasonEventConflict       = "event_conflict"
	ReasonIdempotencyConflict = "idempotency_conflict"
	ReasonBelowReplayFloor    = "below_replay_floor"
	ReasonSequenceConflict    = "sequence_conflict"
	ReasonSequenceTooFarAhead = "sequence_too_far_ahead"
)

// Actor is who asked (the verified credential) and the request's correlation id.
type Actor struct{ TenantID, AccountID, DeviceID, CorrelationID string }

// IngestInput is an envelope that passed steps 1–4. The tenant is the actor's.
type IngestInput struct {
	ProjectID, ProducerID, EventIdentity, KeyID string
	IdempotencyDigest, ContentDigest            [32]byte
	Sequence                                    int64
	IssuedAt                                    time.Time
	Canonical                                   []byte    // JCS of the whole signed envelope: the stored form
	ExpiresAt                                   time.Time // payload expiry (received_at + PAYLOAD_RETENTION)
	MaxAhead                                    int64     // sequence_too_far_ahead bound; <= 0 means DefaultMaxAhead
	// VerifiedWith, when set, is the public key the signature was verified
	// with, believed active. The envelope is decided only if the key is still
	// active with exactly this public key inside the ingest transaction, so a
	// caller may cache active keys and still see a retirement, revocation or
	// prune committed before its transaction (else: OutcomeStale).
	VerifiedWith []byte
}

// Result is the answer to one envelope. Cursor is the stream's cursor after
// the request (also filled for refusals decided at step 5; 0 for refusals
// decided before it).
type Result struct {
	Outcome       Outcome
	Reason        string
	EventIdentity string
	Cursor        int64
}

// AuditEntry is an answer decided before step 5 (forbidden, route_mismatch,
// unknown_key, invalid_*, ...). ProjectID and EventIdentity may be empty.
type AuditEntry struct {
	ProjectID, EventIdentity string
	Outcome                  string
	Reason                   string
}

// BatchItem is one element of IngestBatch: exactly one of Ingest or Refusal.
type BatchItem struct {
	Actor   Actor
	Ingest  *IngestInput
	Refusal *AuditEntry
}

// lockStreamSQL takes the (tenant, project, producer) stream lock, creating
// the stream on first sight. DO UPDATE (not DO NOTHING + SELECT FOR UPDATE)
// because it always returns with the row locked, even when another
// transaction created it concurrently.
const lockStreamSQL = `
INSERT INTO streams (tenant_id, project_id, producer_id) VALUES (@tenant, @project, @producer)
ON CONFLICT (tenant_id, project_id, producer_id) DO UPDATE SET cursor = streams.cursor`

// lockStreamsSQL locks several streams in one fixed order, so concurrent
// batches never wait on each other in a cycle. Rows must be distinct.
const lockStreamsSQL = `
INSERT INTO streams (tenant_id, project_id, producer_id)
SELECT t, p, d FROM unnest(@tenants::text[], @projects::text[], @producers::text[]) AS s(t, p, d)
ORDER BY t COLLATE "C", p COLLATE "C", d COLLATE "C"
ON CONFLICT (tenant_id, project_id, producer_id) DO UPDATE SET cursor = streams.cursor`

// decideSQL is step 5 and step 6 in one statement, run after lockStreamSQL in
// the same transaction. Being a separate statement matters: under READ
// COMMITTED it takes its snapshot after the lock was granted, so it sees
// everything the previous lock holder committed.
//
// The verdict follows the contract's order (a–e), after the key check of
// IngestInput.VerifiedWith ('stale': nothing is written). An accepted envelope writes
// its identity, payload and audit row; the cursor moves only when the
// envelope takes the slot right after it, and then runs through every
// retained sequence that is now contiguous (sequence - row_number() stays
// equal to @sequence exactly along the run). Any other verdict writes the
// audit row alone. Data-modifying CTEs always run to completion, referenced
// or not. @envelope is the canonical envelope, @event_hex the identity as
// the audit row shows it, @verified_with the public key the caller verified
// with, or NULL (see IngestInput.VerifiedWith).
const decideSQL = `
WITH st AS (
    SELECT cursor, replay_floor FROM streams
    WHERE tenant_id = @tenant AND project_id = @project AND producer_id = @producer
), ev AS (
    SELECT content_digest FROM event_identities WHERE tenant_id = @tenant AND event_identity = @event::bytea
), idem AS (
    SELECT content_digest FROM event_identities WHERE tenant_id = @tenant AND idempotency_digest = @idempotency_digest::bytea
), verdict AS (
    SELECT st.cursor, st.replay_floor, CASE
        WHEN @verified_with::bytea IS NOT NULL AND NOT EXISTS (
                SELECT FROM producer_keys
                WHERE tenant_id = @tenant AND key_id = @key_id AND state = 'active' AND public_key = @verified_with::bytea)
            THEN 'stale'
        WHEN EXISTS (SELECT FROM ev) THEN
            CASE WHEN (SELECT content_digest FROM ev) = @content_digest::bytea THEN 'duplicate' ELSE 'event_conflict' END
        WHEN EXISTS (SELECT FROM idem) THEN
            CASE WHEN (SELECT content_digest FROM idem) = @content_digest::bytea THEN 'duplicate' ELSE 'idempotency_conflict' END
        WHEN @sequence::bigint <= st.replay_floor THEN 'below_replay_floor'
        WHEN EXISTS (SELECT FROM event_identities
                     WHERE tenant_id = @tenant AND project_id = @project AND producer_id = @producer
                       AND sequence = @sequence::bigint)
            THEN 'sequence_conflict'
        WHEN @sequence::bigint > st.cursor + @max_ahead::bigint THEN 'sequence_too_far_ahead'
        ELSE 'accepted'
    END AS v
    FROM st
), advance AS (
    SELECT @sequence::bigint + (
        SELECT count(*) FROM (
            SELECT sequence - row_number() OVER (ORDER BY sequence) AS k
            FROM event_identities
            WHERE tenant_id = @tenant AND project_id = @project AND producer_id = @producer
              AND sequence > @sequence::bigint
        ) run WHERE run.k = @sequence::bigint
    ) AS cursor
    FROM verdict
    WHERE v = 'accepted' AND @sequence::bigint = greatest(verdict.cursor, verdict.replay_floor) + 1
), identity AS (
    INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence,
                                  idempotency_digest, content_digest, key_id, issued_at)
    SELECT @tenant, @event::bytea, @project, @producer, @sequence::bigint, @idempotency_digest::bytea,
           @content_digest::bytea, @key_id, @issued_at::timestamptz
    FROM verdict WHERE v = 'accepted'
), payload AS (
    INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
    SELECT @tenant, @event::bytea, @envelope::bytea, @expires_at::timestamptz
    FROM verdict WHERE v = 'accepted'
), moved AS (
    UPDATE streams SET cursor = advance.cursor, updated_at = now()
    FROM advance
    WHERE tenant_id = @tenant AND project_id = @project AND producer_id = @producer
), audit AS (
    INSERT INTO audit_events (tenant_id, project_id, account_id, device_id, event_identity,
                              outcome, reason, correlation_id)
    SELECT @tenant, @project, @account, @device, @event_hex,
           CASE WHEN v IN ('accepted', 'duplicate') THEN v ELSE 'refused' END,
           CASE WHEN v IN ('accepted', 'duplicate') THEN '' ELSE v END,
           @correlation_id
    FROM verdict WHERE v <> 'stale'
)
SELECT v, coalesce((SELECT cursor FROM advance), verdict.cursor) FROM verdict`

const insertAuditSQL = `
INSERT INTO audit_events (tenant_id, project_id, account_id, device_id, event_identity,
                          outcome, reason, correlation_id)
VALUES (@tenant, @project, @account, @device, @event_hex, @outcome, @reason, @correlation_id)`

// prepared is a validated item ready to queue.
type prepared struct {
	actor   Actor
	in      *IngestInput
	ev      []byte
	refusal *AuditEntry
}

func validActor(a Actor) bool {
	// Account and device may be empty (an operator action may have neither);
	// the tenant never is: unauthenticated requests are never audited.
	return validIdentity(a.TenantID) &&
		(a.AccountID == "" || validIdentity(a.AccountID)) &&
		(a.DeviceID == "" || validIdentity(a.DeviceID)) &&
		correlationRE.MatchString(a.CorrelationID)
}

func prepareIngest(a Actor, in *IngestInput) (prepared, bool) {
	if !validActor(a) || !validIdentity(in.ProjectID, in.ProducerID, in.KeyID) {
		return prepared{}, false
	}
	ev, ok := decodeEventIdentity(in.EventIdentity)
	if !ok || in.Sequence < 1 || in.Sequence > maxSequence || len(in.Canonical) == 0 ||
		in.IssuedAt.IsZero() || in.ExpiresAt.IsZero() {
		return prepared{}, false
	}
	return prepared{actor: a, in: in, ev: ev}, true
}

func prepareRefusal(a Actor, e *AuditEntry) (prepared, bool) {
	if !validActor(a) || !codeRE.MatchString(e.Outcome) || (e.Reason != "" && !codeRE.MatchString(e.Reason)) ||
		(e.ProjectID != "" && !validIdentity(e.ProjectID)) {
		return prepared{}, false
	}
	if e.EventIdentity != "" {
		if _, ok := decodeEventIdentity(e.EventIdentity); !ok {
			return prepared{}, false
		}
	}
	return prepared{actor: a, refusal: e}, true
}

// queue adds the envelope's decideSQL to the pipeline.
func (p prepared) queue(b *pgx.Batch) {
	a, in := p.actor, p.in
	maxAhead := in.MaxAhead
	if maxAhead <= 0 {
		maxAhead = DefaultMaxAhead
	}
	b.Queue(decideStmt.text, decideStmt.bind(pgx.StrictNamedArgs{"tenant": a.TenantID, "project": in.ProjectID, "producer": in.ProducerID,
		"event": p.ev, "idempotency_digest": in.IdempotencyDigest[:], "content_digest": in.ContentDigest[:],
		"sequence": in.Sequence, "key_id": in.KeyID, "issued_at": in.IssuedAt, "envelope": in.Canonical,
		"expires_at": in.ExpiresAt, "max_ahead": maxAhead, "account": a.AccountID, "device": a.DeviceID,
		"event_hex": in.EventIdentity, "correlation_id": a.CorrelationID, "verified_with": in.VerifiedWith}))
}

// read collects decideSQL's answer from the pipeline.
func (p prepared) read(br pgx.BatchResults) (Result, error) {
	var v string
	var cursor int64
	if err := br.QueryRow().Scan(&v, &cursor); err != nil {
		return Result{}, err
	}
	r := Result{EventIdentity: p.in.EventIdentity, Cursor: cursor}
	switch v {
	case string(OutcomeAccepted), string(OutcomeDuplicate), string(OutcomeStale):
		r.Outcome = Outcome(v)
	default:
		r.Outcome, r.Reason = OutcomeRefused, v
	}
	return r, nil
}

// Ingest runs contract §2 steps 5–6 for one envelope: one transaction under
// the stream lock that commits the identity, payload, cursor advance and audit
// row together — or, for a duplicate or refusal, the audit row alone.
//
// BEGIN, the lock and the decision go out as one pipeline (one round trip),
// then COMMIT (a second). An error means the caller must not acknowledge;
// only if the connection breaks after COMMIT was sent may the work have
// committed anyway (a lost acknowledgement), and a retry answers duplicate.
func (s *Inbound) Ingest(ctx context.Context, a Actor, in IngestInput) (Result, error) {
	rs, err := s.ingestBatch(ctx, "ingest", []BatchItem{{Actor: a, Ingest: &in}}, nil)
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// Audit commits one audit row for an answer decided before step 5.
func (s *Inbound) Audit(ctx context.Context, a Actor, e AuditEntry) error {
	const op = "audit"
	p, ok := prepareRefusal(a, &e)
	if !ok {
		return newErr(op, ErrInvalid)
	}
	_, err := s.sqlDB().ExecContext(ctx, insertAuditStmt.text, insertAuditStmt.bind(pgx.StrictNamedArgs{
		"tenant":  a.TenantID,
		"project": e.ProjectID, "account": a.AccountID, "device": a.DeviceID, "event_hex": e.EventIdentity,
		"outcome": e.Outcome, "reason": e.Reason, "correlation_id": p.actor.CorrelationID}))
	return classify(ctx, op, err)
}

// IngestBatch runs items in order in one transaction, each answered exactly
// as if sent alone in that order (a later item sees the earlier ones). Every
// distinct stream is locked up front in a fixed order, so concurrent batches
// cannot deadlock on stream locks. An error means nothing was acknowledged
// (see Ingest for the one ambiguous case). An invalid item fails the whole
// batch with ErrInvalid before any database work.
func (s *Inbound) IngestBatch(ctx context.Context, items []BatchItem) ([]Result, error) {
	return s.ingestBatch(ctx, "ingest batch", items, nil)
}

// IngestBatchCommitting is IngestBatch that calls committing once every
// decision is made and only the transaction's commit (its last write, COMMIT
// and the WAL flush) is left, or, if it fails sooner, before it returns.
// committing is called exactly once. A group committer uses it to decide the
// next group while this one waits for its flush: PostgreSQL flushes the
// commits that wait together, so the flush is shared instead of queued.
func (s *Inbound) IngestBatchCommitting(ctx context.Context, items []BatchItem, committing func()) ([]Result, error) {
	var once sync.Once
	signal := func() { once.Do(committing) }
	defer signal()
	return s.ingestBatch(ctx, "ingest batch", items, signal)
}

// ingestBatch runs items; committing, when not nil, is called when only the
// commit is left (it may be called again by a rerun; callers make it idempotent).
func (s *Inbound) ingestBatch(ctx context.Context, op string, items []BatchItem, committing func()) ([]Result, error) {
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > MaxBatch {
		return nil, newErr(op, ErrInvalid)
	}
	ps := make([]prepared, len(items))
	for i, it := range items {
		var ok bool
		switch {
		case it.Ingest != nil && it.Refusal == nil:
			ps[i], ok = prepareIngest(it.Actor, it.Ingest)
		case it.Refusal != nil && it.Ingest == nil:
			ps[i], ok = prepareRefusal(it.Actor, it.Refusal)
		}
		if !ok {
			return nil, newErr(op, ErrInvalid)
		}
	}
	run := func(c *pgx.Conn) ([]Result, error) {
		if len(ps) == 1 && ps[0].in != nil {
			return runSingle(ctx, c, ps[0], committing)
		}
		return runSetBatch(ctx, c, newSetBatch(ps), committing)
	}

	var results []Result
	var err error
	// A unique violation here can only come from another stream of the same
	// project committing the same event or idempotency key first (everything
	// else is decided under our stream lock); rerunning answers it as a
	// duplicate or conflict. Deadlocks between batches waiting on each other's
	// unique-index entries resolve the same way.
	for attempt := 0; ; attempt++ {
		err = s.withPgx(ctx, func(c *pgx.Conn) error {
			var rerr error
			results, rerr = run(c)
			return rerr
		})
		if err == nil || !retryable(err) || attempt >= s.opts.MaxRetries || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	return results, nil
}

// runSingle sends BEGIN, the stream lock and decideSQL as one pipeline (one
// round trip), reads the answer, and only then sends COMMIT. The server
// commits nothing unless that COMMIT arrives: a caller that gives up
// (cancelled context) or a session that dies before it leaves no trace.
// Every path leaves the connection idle, or marks it bad so the pool drops it.
func runSingle(ctx context.Context, c *pgx.Conn, p prepared, committing func()) (_ []Result, err error) {
	defer func() {
		if err != nil {
			err = releaseAfterError(ctx, c, err)
		}
	}()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(lockStreamStmt.text, lockStreamStmt.bind(pgx.StrictNamedArgs{"tenant": p.actor.TenantID,
		"project": p.in.ProjectID, "producer": p.in.ProducerID}))
	p.queue(b)
	br := c.SendBatch(ctx, b)
	var r Result
	_, err = br.Exec() // BEGIN
	if err == nil {
		_, err = br.Exec() // stream lock
	}
	if err == nil {
		r, err = p.read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	// Decided, not yet committed: a caller that gave up meanwhile gets
	// nothing committed rather than an answer it will not read.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if committing != nil {
		committing()
	}
	tag, err := c.Exec(ctx, "COMMIT")
	if err != nil {
		return nil, err
	}
	if tag.String() != "COMMIT" {
		return nil, errRolledBack
	}
	return []Result{r}, nil
}

// releaseAfterError leaves c idle after a failed pipeline, or closes it and
// adds driver.ErrBadConn so the pool drops it.
func releaseAfterError(ctx context.Context, c *pgx.Conn, err error) error {
	if c.IsClosed() {
		return err
	}
	// After an error part-way through a pipeline, pgx may return from
	// BatchResults.Close with the rest of the pipeline unread: the
	// connection is still busy and would fail whoever draws it next (the
	// rerun of a lost unique race included). Such a connection is closed
	// and reported bad, so the pool drops it.
	if c.PgConn().IsBusy() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = c.Close(cctx)
		return errors.Join(err, driver.ErrBadConn)
	}
	if c.PgConn().TxStatus() != 'I' {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := c.Exec(rctx, "ROLLBACK"); rerr != nil {
			return errors.Join(err, driver.ErrBadConn)
		}
	}
	return err
}

// hexIdentity renders a stored event identity as the contract's lowercase hex.
func hexIdentity(b []byte) string { return hex.EncodeToString(b) }
