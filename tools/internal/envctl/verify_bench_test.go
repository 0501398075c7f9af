package envctl

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// benchRows sizes the verify benchmark: inbound streams × events per stream, and outbound messages.
const (
	benchStreams         = 100
	benchEventsPerStream = 2000
	benchMessages        = 50000
)

// seedSQL fills a migrated database with consistent rows in bulk (as the owner, bypassing the store,
// which would take minutes for this many): every stream contiguous, every payload with its identity,
// every message delivered once.
const seedSQL = `
INSERT INTO streams (tenant_id, project_id, producer_id, cursor)
SELECT 't1', 'p1', 'd' || s, %[2]d FROM generate_series(1, %[1]d) s;

INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest,
                              content_digest, key_id, issued_at)
SELECT 't1', sha256(convert_to('e' || s || '.' || q, 'UTF8')), 'p1', 'd' || s, q,
       sha256(convert_to('k' || s || '.' || q, 'UTF8')), sha256(convert_to('c' || s || '.' || q, 'UTF8')), 'k1', now()
FROM generate_series(1, %[1]d) s, generate_series(1, %[2]d) q;

INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
SELECT tenant_id, event_identity, convert_to('{"payload":{}}', 'UTF8'), now() + interval '1 hour' FROM event_identities;

INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
VALUES ('t1', 'ep_000000000000000000000001', 'p1', 'x', 'https://hooks.example.test/x', 'ref');

INSERT INTO outbound_streams (tenant_id, project_id, producer_id, last_sequence) VALUES ('t1', 'p1', 'svc1', %[3]d);

INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
                                idempotency_digest, request_digest, envelope)
SELECT 't1', sha256(convert_to('o' || q, 'UTF8')), 'p1', 'svc1', q, 'x', sha256(convert_to('i' || q, 'UTF8')),
       sha256(convert_to('r' || q, 'UTF8')), convert_to('{"payload":{}}', 'UTF8')
FROM generate_series(1, %[3]d) q;

INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity, status, attempts,
                             max_attempts, budget, delivered_at)
SELECT 't1', 'msg_' || lpad(to_hex(q), 24, '0'), 'p1', 'x', 'ep_000000000000000000000001',
       sha256(convert_to('o' || q, 'UTF8')), 'delivered', 1, 12, 12, now()
FROM generate_series(1, %[3]d) q;

ANALYZE;`

// BenchmarkVerify is one full `envctl verify` pass (every invariant, one snapshot) over 200,000
// identities with payloads in 100 streams and 50,000 outbound messages.
func BenchmarkVerify(b *testing.B) {
	dsn := storetest.NewDatabase(b)
	ctx := context.Background()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	// The sizes are constants of this file, so formatting them into the SQL is safe; without
	// arguments pgx sends the whole script in one simple-protocol round trip.
	if _, err := db.ExecContext(ctx, fmt.Sprintf(seedSQL, benchStreams, benchEventsPerStream, benchMessages)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		res, err := checkInvariants(ctx, db)
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range res {
			if r.count != 0 {
				b.Fatalf("seeded database violates %s: %d", r.name, r.count)
			}
		}
	}
	b.ReportMetric(float64(benchStreams*benchEventsPerStream*2+benchMessages*2)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}
