package store_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// schemaBefore0006 puts back the index definitions of migrations 0001 and
// 0002 that 0006 replaced, built in their original order, so one benchmark
// run compares the two schemas on the same machine minute.
const schemaBefore0006 = `
DROP INDEX event_identities_idempotency_idx, event_identities_sequence_idx, event_identities_key_idx,
           outbound_envelopes_idempotency_idx, outbound_envelopes_sequence_idx;
CREATE UNIQUE INDEX event_identities_idempotency_idx ON event_identities (tenant_id, idempotency_digest);
CREATE UNIQUE INDEX event_identities_sequence_idx ON event_identities (tenant_id, project_id, producer_id, sequence);
CREATE INDEX event_identities_key_idx ON event_identities (tenant_id, key_id, issued_at);
CREATE UNIQUE INDEX outbound_envelopes_idempotency_idx ON outbound_envelopes (tenant_id, project_id, idempotency_digest);
CREATE UNIQUE INDEX outbound_envelopes_sequence_idx ON outbound_envelopes (tenant_id, project_id, producer_id, sequence);`

const firstMinuteProducers = 16

// firstMinuteRows is each half's size: STORE_BENCH_FIRST_MINUTE_ROWS, by
// default 20,000 (the figure).
func firstMinuteRows(b *testing.B) int {
	v := os.Getenv("STORE_BENCH_FIRST_MINUTE_ROWS")
	if v == "" {
		return 20_000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < firstMinuteProducers {
		b.Fatalf("STORE_BENCH_FIRST_MINUTE_ROWS=%q: want a number of at least %d", v, firstMinuteProducers)
	}
	return n
}

// BenchmarkFirstMinute writes 20,000 then another 20,000 single envelopes
// (Ingest) and outbox enqueues (Enqueue) into a fresh, never-analyzed
// database, 16 producers of one tenant and project at once, and reports the
// rate of each half. Autovacuum is off on the tables, as it is in effect for
// the first minute (its first ANALYZE comes on its first round after 50
// rows), so the plans made on the empty tables stay. schema=before0006 runs
// on the indexes 0006 replaced. Run it with -benchtime=1x and repeat with
// -count to alternate the two. STORE_BENCH_FIRST_MINUTE_ROWS sets the size
// of a half.
func BenchmarkFirstMinute(b *testing.B) {
	for _, schema := range []string{"before0006", "current"} {
		b.Run("schema="+schema, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				dsn := storetest.NewDatabase(b)
				storetest.Durable(b, dsn)
				s, err := store.Open(context.Background(), dsn, store.Options{MaxOpenConns: 32})
				if err != nil {
					b.Fatal(err)
				}
				db := storetest.AdminDB(b, dsn)
				for _, tbl := range planTables {
					if _, err := db.Exec(`ALTER TABLE ` + tbl + ` SET (autovacuum_enabled = off)`); err != nil {
						b.Fatal(err)
					}
				}
				if schema == "before0006" {
					if _, err := db.Exec(schemaBefore0006); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := s.Outbox().AddEndpoint(context.Background(), store.Endpoint{TenantID: "t1", ProjectID: "p1",
					Topic: "bench", URL: "https://hooks.example.test/bench", SecretRef: "sec-bench"}); err != nil {
					b.Fatal(err)
				}
				for half := 1; half <= 2; half++ {
					b.ReportMetric(firstMinuteHalf(b, s, "ingest", half), fmt.Sprintf("ingest%d/s", half))
				}
				for half := 1; half <= 2; half++ {
					b.ReportMetric(firstMinuteHalf(b, s, "enqueue", half), fmt.Sprintf("enqueue%d/s", half))
				}
				_ = s.Close()
			}
		})
	}
}

// firstMinuteHalf writes the half-th firstMinuteRows rows, each producer its
// own stream in sequence order, and returns rows per second.
func firstMinuteHalf(b *testing.B, s *store.Store, kind string, half int) float64 {
	ctx := context.Background()
	per := firstMinuteRows(b) / firstMinuteProducers
	var wg sync.WaitGroup
	errs := make(chan error, firstMinuteProducers)
	start := time.Now()
	for p := 0; p < firstMinuteProducers; p++ {
		producer := fmt.Sprintf("d%d", p)
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := store.Actor{TenantID: "t1", AccountID: "acct", DeviceID: producer, CorrelationID: "bench"}
			for i := 1; i <= per; i++ {
				seq := int64((half-1)*per + i)
				var err error
				if kind == "ingest" {
					var r store.Result
					r, err = s.Inbound().Ingest(ctx, a, benchInput(0, producer, seq))
					if err == nil && r.Outcome != store.OutcomeAccepted {
						err = fmt.Errorf("ingest %s %d: %s %s", producer, seq, r.Outcome, r.Reason)
					}
				} else {
					key := sha256.Sum256([]byte(fmt.Sprintf("%s-%d", producer, seq)))
					_, err = s.Outbox().Enqueue(ctx, a, store.EnqueueRequest{ProjectID: "p1", ProducerID: producer, Topic: "bench",
						IdempotencyDigest: key, RequestDigest: key, MaxAttempts: 12,
						Build: func(sq int64) ([]byte, string, error) {
							return benchCanonical, fmt.Sprintf("%x", sha256.Sum256([]byte(fmt.Sprintf("o-%s-%d", producer, sq)))), nil
						}})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(per*firstMinuteProducers) / elapsed.Seconds()
}
