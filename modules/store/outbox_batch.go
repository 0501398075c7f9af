package store

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Enqueues are decided set-based, like inbound batches (ingest_set.go): one
// transaction takes every outbound stream lock of its items, reads what each
// item needs with one statement per step, decides the items in order here,
// and writes every stream, envelope and message with one statement. A lone
// POST /v1/outbox, a group of them (the ingest-api's group commit, contract
// §8.6) and POST /v1/outbox/batch (§8.5) all take this path, so each item is
// answered as if it had been sent alone, in item order.

// lockOutboundStreamsSQL locks the outbound streams that exist, in the order
// given (EnqueueBatch sorts them, so concurrent transactions never wait on
// each other in a cycle), and reads each one's last sequence after its lock
// was granted. A stream with no row yet gets no lock: its first sequences are
// raced for by the write, where the sequence's unique index refuses the loser
// (23505), whose rerun then finds the row.
const lockOutboundStreamsSQL = `
SELECT s.i, o.last_sequence
FROM unnest(@tenants::text[], @projects::text[], @producers::text[]) WITH ORDINALITY AS s(t, p, d, i)
CROSS JOIN LATERAL (
    SELECT last_sequence FROM outbound_streams
    WHERE tenant_id = s.t AND project_id = s.p AND producer_id = s.d
    FOR UPDATE
) o`

// outboundByKeySQL finds, per item, an envelope already stored under its
// idempotency key, with its request digest, its bytes and its message ids
// (ordered as EnqueueResult says). Rows come back only where one was found;
// most items are new. Each lookup is a LATERAL subquery kept by OFFSET 0, so
// a generic plan made on empty tables still uses the keys (see lookupSQL).
// The bytes are read new-then-old (migration 0008: outbound_bodies, then the
// old column of a body not moved yet); NULL when the retention-janitor
// deleted them (§8.9).
const outboundByKeySQL = `
SELECT u.i, e.event_identity, e.request_digest,
       coalesce((SELECT b.envelope FROM outbound_bodies b
                 WHERE b.tenant_id = u.t AND b.event_identity = e.event_identity), e.envelope),
       ARRAY(SELECT m.message_id FROM outbox_messages m
             WHERE m.tenant_id = u.t AND m.event_identity = e.event_identity
             ORDER BY m.endpoint_id, m.message_id)
FROM unnest(@tenants::text[], @projects::text[], @idempotency_digests::bytea[]) WITH ORDINALITY AS u(t, p, k, i)
CROSS JOIN LATERAL (
    SELECT event_identity, request_digest, envelope FROM outbound_envelopes
    WHERE tenant_id = u.t AND project_id = u.p AND idempotency_digest = u.k
    OFFSET 0
) e`

// topicEndpointsSQL is the fan-out of each distinct (tenant, project, topic):
// at most @max_endpoints (MaxTopicEndpoints) active endpoints, the first by id. The
// endpoint guard keeps a topic within the bound, so the LIMIT cuts only rows
// written past it (by hand, a restore, a concurrent add by an envctl older
// than the guard); then the enqueue still writes at most the bound, and the
// endpoints past the first by id get nothing, which envctl verify reports
// (topic_over_endpoint_limit). Refusing the enqueue instead would stop the
// whole topic over one surplus row. The sort runs over the topic's rows
// (OFFSET 0 keeps it apart): ordered in the scan, an empty table's plan reads
// the tenant's every endpoint through the primary key for its order.
const topicEndpointsSQL = `
SELECT s.i, ARRAY(SELECT e.endpoint_id FROM (
                      SELECT endpoint_id FROM endpoints
                      WHERE tenant_id = s.t AND project_id = s.p AND topic = s.c AND state = 'active'
                      OFFSET 0) e
                  ORDER BY e.endpoint_id
                  LIMIT @max_endpoints)
FROM unnest(@tenants::text[], @projects::text[], @topics::text[]) WITH ORDINALITY AS s(t, p, c, i)`

// writeOutboundSQL commits the new items: each stream's last sequence (a
// stream's first enqueue inserts its row), each envelope's identity and its
// body (outbound_bodies only, migration 0008; the identity row keeps none),
// and one pending message per endpoint. The bodies' and messages' foreign
// keys are checked at the end of the statement, when the envelopes inserted
// beside them are visible.
// The bodies (@bodies, the signed envelopes) are in the envelopes' order.
const writeOutboundSQL = `
WITH stream AS (
    INSERT INTO outbound_streams (tenant_id, project_id, producer_id, last_sequence)
    SELECT * FROM unnest(@stream_tenants::text[], @stream_projects::text[], @stream_producers::text[],
                         @last_sequences::bigint[])
    ON CONFLICT (tenant_id, project_id, producer_id)
    DO UPDATE SET last_sequence = EXCLUDED.last_sequence, updated_at = now()
), envelope AS (
    INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
                                    idempotency_digest, request_digest)
    SELECT * FROM unnest(@envelope_tenants::text[], @envelope_events::bytea[], @envelope_projects::text[],
                         @envelope_producers::text[], @envelope_sequences::bigint[], @envelope_topics::text[],
                         @envelope_idempotency_digests::bytea[], @envelope_request_digests::bytea[])
), body AS (
    INSERT INTO outbound_bodies (tenant_id, event_identity, envelope)
    SELECT * FROM unnest(@envelope_tenants::text[], @envelope_events::bytea[], @bodies::bytea[])
)
INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity,
                             max_attempts, budget, next_attempt_at)
SELECT t, id, p, c, ep, ev, n, n, now()
FROM unnest(@message_tenants::text[], @message_ids::text[], @message_projects::text[], @message_topics::text[],
            @message_endpoints::text[], @message_events::bytea[], @message_max_attempts::int[])
     AS m(t, id, p, c, ep, ev, n)`

// EnqueueItem is one enqueue of a batch: the actor's tenant owns it.
type EnqueueItem struct {
	Actor   Actor
	Request EnqueueRequest
}

// EnqueueAnswer is one item's answer: its result, or Err, which is
// ErrIdempotencyConflict, ErrNoEndpoint, ErrInvalid (Build returned no
// envelope or a bad identity) or the error Build returned. An item with Err
// took no sequence and stored nothing.
type EnqueueAnswer struct {
	Result EnqueueResult
	Err    error
}

// EnqueueBatch runs items in order in one transaction, each answered exactly
// as if sent alone in that order: a later item with an earlier one's
// idempotency key is its repeat (or conflict), and a stream's new items take
// consecutive sequences in item order. Either every answer is committed when
// it returns, or it returns an error and nothing was. An invalid item fails
// the whole batch with ErrInvalid before any database work.
//
// Build runs for the new items while their stream locks are held, the
// builds of different items at once on every core (see decide); an item's
// Build may run again if the transaction is rerun after losing a race, or if
// an earlier item's Build failed and moved its sequence.
func (s *Outbox) EnqueueBatch(ctx context.Context, items []EnqueueItem) ([]EnqueueAnswer, error) {
	return s.enqueueBatch(ctx, items, nil)
}

// EnqueueBatchCommitting is EnqueueBatch that calls committing once, when
// every item is decided and built and only the write and commit are left (or,
// if it fails sooner, before it returns); see IngestBatchCommitting.
func (s *Outbox) EnqueueBatchCommitting(ctx context.Context, items []EnqueueItem, committing func()) ([]EnqueueAnswer, error) {
	var once sync.Once
	signal := func() { once.Do(committing) }
	defer signal()
	return s.enqueueBatch(ctx, items, signal)
}

func (s *Outbox) enqueueBatch(ctx context.Context, items []EnqueueItem, committing func()) ([]EnqueueAnswer, error) {
	const op = "enqueue batch"
	if len(items) == 0 {
		return nil, nil
	}
	if len(items) > MaxEnqueueBatch {
		return nil, newErr(op, ErrInvalid)
	}
	for _, it := range items {
		a, r := it.Actor, it.Request
		if !validActor(a) || !validIdentity(r.ProjectID, r.ProducerID) || !ValidTopic(r.Topic) ||
			r.MaxAttempts < MinMaxAttempts || r.MaxAttempts > MaxMaxAttempts || r.Build == nil {
			return nil, newErr(op, ErrInvalid)
		}
	}
	b := newEnqueueSet(items)
	var answers []EnqueueAnswer
	var err error
	// A unique violation can only come from a race the stream locks do not
	// cover: the same idempotency key from another producer of the project,
	// or a stream's first sequences taken by two transactions at once. The
	// rerun answers it from what the winner committed.
	for attempt := 0; ; attempt++ {
		err = s.withPgx(ctx, func(c *pgx.Conn) error {
			var rerr error
			answers, rerr = runEnqueueSet(ctx, c, b, committing)
			return rerr
		})
		if err == nil || !retryable(err) || attempt >= s.opts.MaxRetries || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	return answers, nil
}

// enqueueSet is one set-based enqueue: its items and their distinct outbound
// streams (sorted: the lock order) and topics.
type enqueueSet struct {
	items   []EnqueueItem
	streams []streamKey
	topics  []streamKey // (tenant, project, topic)
}

func newEnqueueSet(items []EnqueueItem) *enqueueSet {
	b := &enqueueSet{items: items}
	seenS, seenT := map[streamKey]bool{}, map[streamKey]bool{}
	for _, it := range items {
		s := streamKey{it.Actor.TenantID, it.Request.ProjectID, it.Request.ProducerID}
		if !seenS[s] {
			seenS[s] = true
			b.streams = append(b.streams, s)
		}
		t := streamKey{it.Actor.TenantID, it.Request.ProjectID, it.Request.Topic}
		if !seenT[t] {
			seenT[t] = true
			b.topics = append(b.topics, t)
		}
	}
	slices.SortFunc(b.streams, func(x, y streamKey) int {
		return cmp.Or(cmp.Compare(x.tenant, y.tenant), cmp.Compare(x.project, y.project), cmp.Compare(x.producer, y.producer))
	})
	return b
}

func columns(keys []streamKey) (a, b, c []string) {
	a, b, c = make([]string, len(keys)), make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		a[i], b[i], c[i] = k.tenant, k.project, k.producer
	}
	return a, b, c
}

func (b *enqueueSet) queueReads(q *pgx.Batch) {
	ts, ps, ds := columns(b.streams)
	q.Queue(lockOutboundStmt.text, lockOutboundStmt.bind(pgx.StrictNamedArgs{"tenants": ts, "projects": ps,
		"producers": ds}))
	tenants, projects, keys := make([]string, len(b.items)), make([]string, len(b.items)), make([][]byte, len(b.items))
	for i, it := range b.items {
		tenants[i], projects[i], keys[i] = it.Actor.TenantID, it.Request.ProjectID, it.Request.IdempotencyDigest[:]
	}
	q.Queue(outboundByKeyStmt.text, outboundByKeyStmt.bind(pgx.StrictNamedArgs{"tenants": tenants, "projects": projects,
		"idempotency_digests": keys}))
	ts, ps, cs := columns(b.topics)
	q.Queue(topicEndpointsStmt.text, topicEndpointsStmt.bind(pgx.StrictNamedArgs{"tenants": ts, "projects": ps,
		"topics": cs, "max_endpoints": MaxTopicEndpoints}))
}

// storedEnqueue is an envelope already stored under an item's key.
type storedEnqueue struct {
	requestDigest, envelope []byte
	messageIDs              []string
}

// enqueueState is what the reads found: each stream's last sequence (absent:
// no row yet), each item's stored envelope, each topic's endpoints.
type enqueueState struct {
	last      map[streamKey]int64
	stored    map[int]storedEnqueue // by item index
	endpoints map[streamKey][]string
}

func (b *enqueueSet) readState(br pgx.BatchResults) (enqueueState, error) {
	st := enqueueState{last: map[streamKey]int64{}, stored: map[int]storedEnqueue{}, endpoints: map[streamKey][]string{}}
	rows, err := br.Query()
	if err != nil {
		return st, err
	}
	for rows.Next() {
		var i int
		var last int64
		if err := rows.Scan(&i, &last); err != nil {
			rows.Close()
			return st, err
		}
		st.last[b.streams[i-1]] = last
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}

	if rows, err = br.Query(); err != nil {
		return st, err
	}
	for rows.Next() {
		var i int
		var ident []byte
		var s storedEnqueue
		if err := rows.Scan(&i, &ident, &s.requestDigest, &s.envelope, &s.messageIDs); err != nil {
			rows.Close()
			return st, err
		}
		st.stored[i-1] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return st, err
	}

	if rows, err = br.Query(); err != nil {
		return st, err
	}
	for rows.Next() {
		var i int
		var eps []string
		if err := rows.Scan(&i, &eps); err != nil {
			rows.Close()
			return st, err
		}
		st.endpoints[b.topics[i-1]] = eps
	}
	rows.Close()
	return st, rows.Err()
}

// idemKey is an idempotency key's scope: (tenant, project, digest).
type idemKey struct {
	tenant, project string
	digest          [32]byte
}

// decide answers every item in order and builds the new ones, returning the
// answers and the write statement's arguments (nil when nothing is new).
//
// Signing is the CPU-heavy part, and it runs while the stream locks are held
// (and, under the group committer, while the next group waits for its turn
// to be decided), so a set with several new items is built on every core: a
// first pass plans which item takes which sequence as if every Build
// succeeds, the builds run in parallel, and the real pass uses them. Should a
// Build fail, the items after it in its stream take other sequences than
// planned, and the real pass builds those again, in order.
func (b *enqueueSet) decide(st enqueueState) ([]EnqueueAnswer, pgx.StrictNamedArgs, error) {
	var plan []plannedBuild
	if _, _, err := b.decideWith(st, func(i int, seq int64) ([]byte, string, error) {
		plan = append(plan, plannedBuild{item: i, seq: seq})
		return []byte("{}"), plannedIdentity, nil
	}); err != nil {
		return nil, nil, err
	}
	if len(plan) < minParallelBuilds {
		return b.decideWith(st, func(i int, seq int64) ([]byte, string, error) { return b.items[i].Request.Build(seq) })
	}
	built := make(map[int]*plannedBuild, len(plan))
	var wg sync.WaitGroup
	next := make(chan *plannedBuild)
	for range min(runtime.GOMAXPROCS(0), len(plan)) {
		wg.Go(func() {
			for p := range next {
				p.canonical, p.identity, p.err = b.items[p.item].Request.Build(p.seq)
			}
		})
	}
	for i := range plan {
		built[plan[i].item] = &plan[i]
		next <- &plan[i]
	}
	close(next)
	wg.Wait()
	return b.decideWith(st, func(i int, seq int64) ([]byte, string, error) {
		if p := built[i]; p != nil && p.seq == seq {
			return p.canonical, p.identity, p.err
		}
		return b.items[i].Request.Build(seq)
	})
}

// minParallelBuilds is the fewest new items built in parallel; below it the
// goroutines cost more than they save.
const minParallelBuilds = 4

// plannedIdentity stands for a planned build's event identity.
const plannedIdentity = "0000000000000000000000000000000000000000000000000000000000000000"

// plannedBuild is one new item's build at the sequence the plan gave it.
type plannedBuild struct {
	item      int
	seq       int64
	canonical []byte
	identity  string
	err       error
}

// decideWith is decide's one pass in item order; build makes item i's
// envelope for seq.
func (b *enqueueSet) decideWith(st enqueueState, build func(i int, seq int64) ([]byte, string, error)) ([]EnqueueAnswer, pgx.StrictNamedArgs, error) {
	const op = "enqueue"
	answers := make([]EnqueueAnswer, len(b.items))
	// What earlier items of this set created, by idempotency key.
	created := map[idemKey]int{}
	var w outboundWrite
	next := map[streamKey]int64{}
	for i, it := range b.items {
		a, r := it.Actor, it.Request
		k := idemKey{a.TenantID, r.ProjectID, r.IdempotencyDigest}
		if s, ok := st.stored[i]; ok {
			if !bytes.Equal(s.requestDigest, r.RequestDigest[:]) {
				answers[i].Err = newErr(op, ErrIdempotencyConflict)
				continue
			}
			answers[i].Result = EnqueueResult{Envelope: s.envelope, MessageIDs: nonNil(s.messageIDs),
				PayloadExpired: s.envelope == nil}
			continue
		}
		if j, ok := created[k]; ok {
			if b.items[j].Request.RequestDigest != r.RequestDigest {
				answers[i].Err = newErr(op, ErrIdempotencyConflict)
				continue
			}
			res := answers[j].Result
			res.Created = false
			answers[i].Result = res
			continue
		}
		endpoints := st.endpoints[streamKey{a.TenantID, r.ProjectID, r.Topic}]
		if len(endpoints) == 0 {
			answers[i].Err = newErr(op, ErrNoEndpoint)
			continue
		}

		sk := streamKey{a.TenantID, r.ProjectID, r.ProducerID}
		seq, ok := next[sk]
		if !ok {
			seq = st.last[sk] + 1
		}
		canonical, eventIdentity, err := build(i, seq)
		if err != nil {
			answers[i].Err = fmt.Errorf("store: enqueue: build envelope: %w", err)
			continue
		}
		ev, ok := decodeEventIdentity(eventIdentity)
		if !ok || len(canonical) == 0 {
			answers[i].Err = newErr(op+": build returned no envelope or a bad identity", ErrInvalid)
			continue
		}
		ids := make([]string, len(endpoints))
		for j := range ids {
			if ids[j], err = newID("msg_"); err != nil {
				return nil, nil, err
			}
		}
		next[sk] = seq + 1
		created[k] = i
		w.envelope(a.TenantID, ev, r, seq, canonical)
		for j, ep := range endpoints {
			w.message(a.TenantID, ids[j], r, ep, ev)
		}
		answers[i].Result = EnqueueResult{Envelope: canonical, MessageIDs: ids, Created: true}
	}
	if len(next) == 0 {
		return answers, nil, nil
	}
	for _, sk := range b.streams {
		if n, ok := next[sk]; ok {
			w.stream(sk, n-1)
		}
	}
	return answers, w.args(), nil
}

// outboundWrite gathers writeOutboundSQL's arrays.
type outboundWrite struct {
	stTenant, stProject, stProducer []string
	stLast                          []int64

	evTenant, evProject, evProducer, evTopic []string
	evIdent, evIdem, evRequest, evBody       [][]byte
	evSeq                                    []int64

	msgTenant, msgID, msgProject, msgTopic, msgEndpoint []string
	msgEvent                                            [][]byte
	msgMax                                              []int32
}

func (w *outboundWrite) stream(k streamKey, last int64) {
	w.stTenant, w.stProject, w.stProducer = append(w.stTenant, k.tenant), append(w.stProject, k.project), append(w.stProducer, k.producer)
	w.stLast = append(w.stLast, last)
}

func (w *outboundWrite) envelope(tenant string, ev []byte, r EnqueueRequest, seq int64, body []byte) {
	w.evTenant, w.evIdent, w.evProject, w.evProducer = append(w.evTenant, tenant), append(w.evIdent, ev), append(w.evProject, r.ProjectID), append(w.evProducer, r.ProducerID)
	w.evSeq, w.evTopic = append(w.evSeq, seq), append(w.evTopic, r.Topic)
	w.evIdem, w.evRequest = append(w.evIdem, r.IdempotencyDigest[:]), append(w.evRequest, r.RequestDigest[:])
	w.evBody = append(w.evBody, body)
}

func (w *outboundWrite) message(tenant, id string, r EnqueueRequest, endpoint string, ev []byte) {
	w.msgTenant, w.msgID, w.msgProject, w.msgTopic = append(w.msgTenant, tenant), append(w.msgID, id), append(w.msgProject, r.ProjectID), append(w.msgTopic, r.Topic)
	w.msgEndpoint, w.msgEvent, w.msgMax = append(w.msgEndpoint, endpoint), append(w.msgEvent, ev), append(w.msgMax, int32(r.MaxAttempts))
}

func (w *outboundWrite) args() pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{
		"stream_tenants": w.stTenant, "stream_projects": w.stProject, "stream_producers": w.stProducer,
		"last_sequences":   w.stLast,
		"envelope_tenants": w.evTenant, "envelope_events": w.evIdent, "envelope_projects": w.evProject,
		"envelope_producers": w.evProducer, "envelope_sequences": w.evSeq, "envelope_topics": w.evTopic,
		"envelope_idempotency_digests": w.evIdem, "envelope_request_digests": w.evRequest,
		"bodies":          w.evBody,
		"message_tenants": w.msgTenant, "message_ids": w.msgID, "message_projects": w.msgProject,
		"message_topics": w.msgTopic, "message_endpoints": w.msgEndpoint, "message_events": w.msgEvent,
		"message_max_attempts": w.msgMax,
	}
}

// runEnqueueSet sends BEGIN, the stream locks and the reads as one pipeline,
// decides and builds, then sends the write and COMMIT as a second. As in
// runSetBatch, the server commits nothing unless COMMIT arrives. When nothing
// is new (repeats and refusals only) it rolls back: those take no sequence,
// and what they answer with was committed before they read it.
func runEnqueueSet(ctx context.Context, c *pgx.Conn, b *enqueueSet, committing func()) (_ []EnqueueAnswer, err error) {
	defer func() {
		if err != nil {
			err = releaseAfterError(ctx, c, err)
		}
	}()
	q := &pgx.Batch{}
	q.Queue("BEGIN")
	q.Queue(genericPlansSQL)
	b.queueReads(q)
	br := c.SendBatch(ctx, q)
	var st enqueueState
	_, err = br.Exec() // BEGIN
	if err == nil {
		_, err = br.Exec() // generic plans
	}
	if err == nil {
		st, err = b.readState(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	answers, args, err := b.decide(st)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if committing != nil {
		committing()
	}
	if args == nil {
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, err
		}
		return answers, nil
	}

	if err := writeAndCommit(ctx, c, writeOutboundStmt, args, nil); err != nil {
		return nil, err
	}
	return answers, nil
}
