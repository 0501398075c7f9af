package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// BenchmarkClaimAtScale is issue 18's claim latency: 1 M pending messages
// (CLAIM_BENCH_PENDING) over 10,000 tenants, 100 each, and one Claim of up to
// 10 messages of a due tenant per iteration, with every tenant due (idle=0)
// and with 9,000 of them holding only messages not yet due (idle=9000): the
// same backlog, a tenth of it due. It reports the p50 and p99 of one claim,
// and of DueTenants(100), the worker's round, measured 20 times after the
// claims. The rows are written in SQL (generate_series), not through the
// API, in a database of their own that is dropped at the end. Run with
// -benchtime=Nx: N claims.
func BenchmarkClaimAtScale(b *testing.B) {
	pending := 1_000_000
	if v := os.Getenv("CLAIM_BENCH_PENDING"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10_000 {
			b.Fatalf("CLAIM_BENCH_PENDING=%q: want a number of at least 10000", v)
		}
		pending = n
	}
	const tenants = 10_000
	for _, idle := range []int{0, 9_000} {
		// Seeded outside b.Run, which runs its function more than once.
		dsn := storetest.NewDatabase(b)
		s := storetest.Open(b, dsn)
		db := storetest.AdminDB(b, dsn)
		start := time.Now()
		for _, q := range []string{
			`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
SELECT 'ct' || g, 'ep_1', 'p1', 'x', 'https://hooks.example.test/', 'sec-ct' || g FROM generate_series(1, $1::int) g`,
			`INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic,
                                idempotency_digest, request_digest)
SELECT 'ct' || g, sha256(('oe' || g)::bytea), 'p1', 'svc', 1, 'x', sha256(('oi' || g)::bytea), sha256(('or' || g)::bytea)
FROM generate_series(1, $1::int) g`,
			`INSERT INTO outbound_bodies (tenant_id, event_identity, envelope)
SELECT 'ct' || g, sha256(('oe' || g)::bytea), '\x7b7d'::bytea FROM generate_series(1, $1::int) g`,
			// Tenants 1..idle have only messages due tomorrow; the others'
			// became due over the last 1,000 seconds.
			`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity, status,
                             max_attempts, budget, next_attempt_at)
SELECT 'ct' || g, 'msg_' || lpad(to_hex(m), 24, '0'), 'p1', 'x', 'ep_1', sha256(('oe' || g)::bytea), 'pending', 12, 12,
       CASE WHEN g <= $3::int THEN now() + interval '1 day' ELSE now() - (m % 1000) * interval '1 second' END
FROM generate_series(1, $1::int) g, generate_series(1, $2::int) m`,
			`VACUUM ANALYZE endpoints, outbound_envelopes, outbound_bodies, outbox_messages`,
		} {
			args := []any{tenants, pending / tenants, idle}
			if q[:6] == "VACUUM" {
				args = nil
			} else if q[:20] != "INSERT INTO outbox_m" {
				args = args[:1]
			}
			if _, err := db.Exec(q, args...); err != nil {
				b.Fatalf("seed: %v\n%s", err, q)
			}
		}
		b.Logf("seeded %d pending messages over %d tenants (%d idle) in %s", pending, tenants, idle, time.Since(start).Round(time.Second))
		b.Run(fmt.Sprintf("tenants=%d/idle=%d", tenants, idle), func(b *testing.B) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, uint64(idle)))
			lat := make([]time.Duration, 0, b.N)
			claimed := 0
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				tenant := fmt.Sprintf("ct%d", idle+1+rng.IntN(tenants-idle))
				t0 := time.Now()
				got, err := s.Outbox().Claim(ctx, tenant, 10, time.Minute)
				lat = append(lat, time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				claimed += len(got)
			}
			b.StopTimer()
			if claimed == 0 {
				b.Fatal("no claim found a due message")
			}
			due := make([]time.Duration, 0, 20)
			for range 20 {
				t0 := time.Now()
				ts, err := s.Outbox().DueTenants(ctx, 100)
				due = append(due, time.Since(t0))
				if err != nil || len(ts) == 0 {
					b.Fatalf("DueTenants = %d tenants, %v", len(ts), err)
				}
			}
			b.ReportMetric(ms(quantile(lat, 0.50)), "claim_p50_ms")
			b.ReportMetric(ms(quantile(lat, 0.99)), "claim_p99_ms")
			b.ReportMetric(ms(quantile(due, 0.50)), "due_tenants_p50_ms")
			b.ReportMetric(ms(quantile(due, 0.99)), "due_tenants_p99_ms")
			b.ReportMetric(float64(claimed)/float64(b.N), "msgs/claim")
		})
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
