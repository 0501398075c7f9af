package chaos

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/tools/internal/envctl"
)

// Violation is one broken promise the checker found.
type Violation struct {
	Check  string // stable name
	Detail string
}

func (v Violation) String() string { return v.Check + ": " + v.Detail }

// CheckResult is what the checker compared and found.
type CheckResult struct {
	Envelopes, Acknowledged, Unanswered int // client side: sent, answered accepted/duplicate, never answered
	Identities                          int // database side
	Messages, Delivered, Dead           int
	LeaseExpiries, Reclaimed            int // sum of lease_expiries; messages claimed again after a lease expired
	SinkRequests                        int
	Violations                          []Violation
}

// maxDetails bounds how many violations of one check are listed; the rest are counted.
const maxDetails = 5

type checker struct {
	res    CheckResult
	perKey map[string]int
}

func (c *checker) fail(check, format string, a ...any) {
	c.perKey[check]++
	if c.perKey[check] > maxDetails {
		return
	}
	c.res.Violations = append(c.res.Violations, Violation{Check: check, Detail: fmt.Sprintf(format, a...)})
}

type dbIdentity struct {
	project, producer string
	sequence          int64
	contentDigest     []byte
	payload           []byte // nil: no payload row
	acceptedAudits    int
}

type dbMessage struct {
	id, status, code, key string
	attempts, expiries    int
	settledAt             sql.NullTime
}

// Check holds the database behind db (opened as its owner) to what the clients of tenant were told
// (ledger) and what the sink received (receipts, by message id). It expects a quiet system: load
// stopped, the outbox drained, the binaries stopped.
//
//   - every `envctl verify` invariant holds (payloads have identities, cursors equal the contiguous
//     runs, outbox counters and settlements are consistent, …);
//   - an envelope sent again after an acknowledgement is a duplicate, never accepted twice;
//   - every envelope answered accepted or duplicate is retained with its identity, sequence, content
//     digest and exact payload bytes, and no answer's cursor is ahead of the stream's cursor;
//   - nothing is half-written: every identity has its payload and exactly one accepted audit row, every
//     accepted audit row its identity, and every identity is an envelope some client sent (a 5xx
//     answer either committed all of an envelope or none of it);
//   - no valid request was refused (contract §7.15: a failing dependency answers 503, never a 4xx), and
//     every 5xx said refused/unavailable, never accepted; no device's producer stopped before the
//     run's end (a refused stream read, a state it could not save);
//   - every outbound stream holds exactly the sequences 1..last_sequence (none skipped by a refusal,
//     a repeat or a group that did not commit);
//   - every enqueued message exists and is delivered or dead (none lost), a repeated enqueue got the
//     original ids and envelope, and every message in the database belongs to a request a client sent;
//   - the sink saw every delivered message at least once with a 2xx answer and a valid signature, and
//     no message was settled by a stale attempt: the last request the sink got for a delivered message
//     was answered 2xx, none arrived after the message's settlement, and no message got more requests
//     than attempts.
func Check(ctx context.Context, db *sql.DB, tenant string, ledger *Ledger, receipts map[string][]Receipt) (CheckResult, error) {
	c := &checker{perKey: map[string]int{}}
	// A fresh database has no statistics yet; without them the planner nests loops over tables of
	// tens of thousands of rows, and the check takes minutes instead of a second.
	if _, err := db.ExecContext(ctx, `ANALYZE streams, event_identities, inbound_payloads, audit_events, `+
		`outbound_envelopes, outbound_bodies, outbox_messages, endpoints`); err != nil {
		return CheckResult{}, fmt.Errorf("analyze: %w", err)
	}
	invs, err := envctl.CheckInvariants(ctx, db)
	if err != nil {
		return CheckResult{}, fmt.Errorf("verify invariants: %w", err)
	}
	for _, inv := range invs {
		if inv.Count != 0 {
			c.fail("verify_"+inv.Name, "%d rows: %s", inv.Count, inv.Why)
		}
	}

	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return CheckResult{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	idents, err := loadIdentities(ctx, tx, tenant)
	if err != nil {
		return CheckResult{}, err
	}
	orphanAudits, err := countOrphanAudits(ctx, tx, tenant)
	if err != nil {
		return CheckResult{}, err
	}
	cursors, err := loadCursors(ctx, tx, tenant)
	if err != nil {
		return CheckResult{}, err
	}
	msgs, err := loadMessages(ctx, tx, tenant)
	if err != nil {
		return CheckResult{}, err
	}
	// Group commit hands out an outbound stream's sequences (contract §8.6): a refusal, a repeat or a
	// rolled-back group takes none, so every stream holds exactly 1..last_sequence.
	var gaps int
	if err := tx.QueryRowContext(ctx, `
SELECT count(*) FROM outbound_streams s
WHERE s.tenant_id = $1 AND s.last_sequence <> (
    SELECT count(*) FROM outbound_envelopes e
    WHERE e.tenant_id = s.tenant_id AND e.project_id = s.project_id AND e.producer_id = s.producer_id
      AND e.sequence BETWEEN 1 AND s.last_sequence)`, tenant).Scan(&gaps); err != nil {
		return CheckResult{}, fmt.Errorf("outbound sequences: %w", err)
	}
	if gaps > 0 {
		c.fail("outbound_sequence_gap", "%d outbound streams do not hold exactly sequences 1..last_sequence", gaps)
	}
	if err := tx.Commit(); err != nil {
		return CheckResult{}, fmt.Errorf("commit: %w", err)
	}

	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	for _, b := range ledger.Bad5xx {
		c.fail("bad_5xx_answer", "%s (want outcome refused, reason unavailable)", b)
	}
	for _, e := range ledger.ClientErrors {
		c.fail("client_stopped", "%s", e)
	}
	c.checkInbound(ledger, idents, cursors, orphanAudits)
	c.checkOutbound(ledger, msgs, receipts)
	return c.res, nil
}

func (c *checker) checkInbound(ledger *Ledger, idents map[string]*dbIdentity, cursors map[string]int64, orphanAudits int) {
	c.res.Identities = len(idents)
	sent := map[string]*SentEnvelope{}
	acked := map[string]map[int64]bool{} // stream -> acknowledged sequences
	streamMax := map[string]int64{}      // highest cursor any answer carried
	for _, s := range ledger.Envelopes {
		c.res.Envelopes++
		sent[s.EventIdentity] = s
		stream := s.Project + "/" + s.Producer
		if acked[stream] == nil {
			acked[stream] = map[int64]bool{}
		}
		streamMax[stream] = max(streamMax[stream], s.MaxCursor)
		if s.Twice {
			c.fail("accepted_twice", "%s seq %d answered accepted again after an acknowledgement", stream, s.Sequence)
		}
		switch {
		case s.Outcome == "accepted" || s.Outcome == "duplicate":
			c.res.Acknowledged++
			acked[stream][s.Sequence] = true
			id, ok := idents[s.EventIdentity]
			switch {
			case !ok:
				c.fail("acknowledged_not_retained", "%s seq %d answered %s, no identity in the database", stream, s.Sequence, s.Outcome)
			case id.sequence != s.Sequence || id.project != s.Project || id.producer != s.Producer ||
				!bytes.Equal(id.contentDigest, s.ContentDigest[:]):
				c.fail("acknowledged_identity_differs", "%s seq %d: database holds %s/%s seq %d digest %x",
					stream, s.Sequence, id.project, id.producer, id.sequence, id.contentDigest)
			case !bytes.Equal(id.payload, s.Canonical):
				c.fail("acknowledged_payload_differs", "%s seq %d: stored payload missing or not the signed bytes", stream, s.Sequence)
			}
		case strings.HasPrefix(s.Outcome, "refused"):
			c.fail("refused_valid_envelope", "%s seq %d answered %s (a valid envelope; a fault must answer 503)", stream, s.Sequence, s.Outcome)
		default:
			c.res.Unanswered++
		}
	}
	for ident, id := range idents {
		stream := id.project + "/" + id.producer
		if _, ok := sent[ident]; !ok {
			c.fail("phantom_envelope", "%s seq %d retained but no client sent it", stream, id.sequence)
		}
		if id.payload == nil {
			c.fail("half_written_envelope", "%s seq %d: identity without payload", stream, id.sequence)
		}
		if id.acceptedAudits != 1 {
			c.fail("half_written_envelope", "%s seq %d: %d accepted audit rows, want 1", stream, id.sequence, id.acceptedAudits)
		}
	}
	if orphanAudits > 0 {
		c.fail("half_written_envelope", "%d accepted audit rows without an identity", orphanAudits)
	}
	for stream, seqs := range acked {
		cur := cursors[stream]
		if streamMax[stream] > cur {
			c.fail("cursor_went_back", "%s: an answer said cursor %d, the stream's cursor is %d", stream, streamMax[stream], cur)
		}
		run := int64(0)
		for seqs[run+1] {
			run++
		}
		if cur < run {
			c.fail("cursor_behind_acknowledged", "%s: sequences 1..%d acknowledged, cursor %d", stream, run, cur)
		}
	}
}

func (c *checker) checkOutbound(ledger *Ledger, msgs map[string]*dbMessage, receipts map[string][]Receipt) {
	c.res.Messages = len(msgs)
	keys := map[string]*SentOutbox{}
	for _, o := range ledger.Outbox {
		keys[o.Key] = o
		if o.Refusal != "" {
			c.fail("refused_valid_enqueue", "outbox %s answered %s", o.Key, o.Refusal)
		}
		if o.Mismatch {
			c.fail("enqueue_repeat_differs", "outbox %s: a repeat answered other message ids or another envelope", o.Key)
		}
		for _, id := range o.MessageIDs {
			if _, ok := msgs[id]; !ok {
				c.fail("enqueued_message_missing", "outbox %s: message %s answered but not in the database", o.Key, id)
			}
		}
	}
	for id, m := range msgs {
		o, ok := keys[m.key]
		switch {
		case !ok:
			c.fail("phantom_message", "message %s (key %q) stored but no client sent its request", id, m.key)
		case o.Answers > 0 && !contains(o.MessageIDs, id):
			c.fail("phantom_message", "message %s of %s is not among the ids the client was given", id, m.key)
		}
		c.res.LeaseExpiries += m.expiries
		if m.expiries > 0 {
			c.res.Reclaimed++
		}
		switch m.status {
		case "delivered":
			c.res.Delivered++
		case "dead":
			c.res.Dead++
		default:
			c.fail("message_lost", "message %s is still %s after the drain (attempts %d)", id, m.status, m.attempts)
		}
		rs := receipts[id]
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].Arrived.Before(rs[j].Arrived) })
		if len(rs) > m.attempts {
			c.fail("more_requests_than_attempts", "message %s: the sink got %d requests for %d attempts", id, len(rs), m.attempts)
		}
		if m.status == "delivered" {
			if !anyOK(rs) {
				c.fail("delivered_not_seen", "message %s delivered but the sink never answered it 2xx", id)
			} else if last := rs[len(rs)-1]; !last.OK() {
				c.fail("settled_by_stale_attempt", "message %s delivered, but the last request (%s) was answered %s",
					id, last.Arrived.Format(time.RFC3339Nano), last.Answer)
			}
		}
		if m.settledAt.Valid && len(rs) > 0 {
			if last := rs[len(rs)-1]; last.Arrived.After(m.settledAt.Time) {
				c.fail("settled_by_stale_attempt", "message %s settled %s at %s, the sink got a request at %s",
					id, m.status, m.settledAt.Time.Format(time.RFC3339Nano), last.Arrived.Format(time.RFC3339Nano))
			}
		}
	}
	for id, rs := range receipts {
		c.res.SinkRequests += len(rs)
		if _, ok := msgs[id]; !ok {
			c.fail("unknown_delivery", "the sink got %d requests for %q, which is no message", len(rs), id)
		}
		for _, r := range rs {
			if strings.HasPrefix(r.Answer, "refused") {
				c.fail("bad_delivery", "message %s: the verifying sink %s the request (signature, timestamp or body)", id, r.Answer)
			}
		}
	}
}

func anyOK(rs []Receipt) bool {
	for _, r := range rs {
		if r.OK() {
			return true
		}
	}
	return false
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func loadIdentities(ctx context.Context, tx *sql.Tx, tenant string) (map[string]*dbIdentity, error) {
	rows, err := tx.QueryContext(ctx, `
WITH a AS (
    SELECT event_identity, count(*) AS n FROM audit_events
    WHERE tenant_id = $1 AND outcome = 'accepted' GROUP BY event_identity
)
SELECT i.event_identity, i.project_id, i.producer_id, i.sequence, i.content_digest, p.envelope, coalesce(a.n, 0)
FROM event_identities i
LEFT JOIN inbound_payloads p ON p.tenant_id = i.tenant_id AND p.event_identity = i.event_identity
LEFT JOIN a ON a.event_identity = encode(i.event_identity, 'hex')
WHERE i.tenant_id = $1`, tenant)
	if err != nil {
		return nil, fmt.Errorf("read identities: %w", err)
	}
	defer rows.Close()
	out := map[string]*dbIdentity{}
	for rows.Next() {
		var ident []byte
		id := &dbIdentity{}
		if err := rows.Scan(&ident, &id.project, &id.producer, &id.sequence, &id.contentDigest, &id.payload, &id.acceptedAudits); err != nil {
			return nil, fmt.Errorf("read identities: %w", err)
		}
		out[hex.EncodeToString(ident)] = id
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read identities: %w", err)
	}
	return out, nil
}

func countOrphanAudits(ctx context.Context, tx *sql.Tx, tenant string) (int, error) {
	var n int
	err := tx.QueryRowContext(ctx, `
SELECT count(*) FROM audit_events a
WHERE a.tenant_id = $1 AND a.outcome = 'accepted'
  AND NOT EXISTS (SELECT FROM event_identities i
                  WHERE i.tenant_id = a.tenant_id AND encode(i.event_identity, 'hex') = a.event_identity)`, tenant).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read audit rows: %w", err)
	}
	return n, nil
}

func loadCursors(ctx context.Context, tx *sql.Tx, tenant string) (map[string]int64, error) {
	rows, err := tx.QueryContext(ctx, `SELECT project_id, producer_id, cursor FROM streams WHERE tenant_id = $1`, tenant)
	if err != nil {
		return nil, fmt.Errorf("read streams: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var p, d string
		var cur int64
		if err := rows.Scan(&p, &d, &cur); err != nil {
			return nil, fmt.Errorf("read streams: %w", err)
		}
		out[p+"/"+d] = cur
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read streams: %w", err)
	}
	return out, nil
}

func loadMessages(ctx context.Context, tx *sql.Tx, tenant string) (map[string]*dbMessage, error) {
	rows, err := tx.QueryContext(ctx, `
SELECT m.message_id, m.status, m.last_error_code, m.attempts, m.lease_expiries, coalesce(m.delivered_at, m.dead_at),
       coalesce(convert_from(coalesce(b.envelope, o.envelope), 'UTF8')::jsonb ->> 'idempotency_key', '')
FROM outbox_messages m
LEFT JOIN outbound_envelopes o ON o.tenant_id = m.tenant_id AND o.event_identity = m.event_identity
LEFT JOIN outbound_bodies b ON b.tenant_id = m.tenant_id AND b.event_identity = m.event_identity
WHERE m.tenant_id = $1`, tenant)
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	out := map[string]*dbMessage{}
	for rows.Next() {
		m := &dbMessage{}
		if err := rows.Scan(&m.id, &m.status, &m.code, &m.attempts, &m.expiries, &m.settledAt, &m.key); err != nil {
			return nil, fmt.Errorf("read outbox: %w", err)
		}
		out[m.id] = m
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	return out, nil
}
