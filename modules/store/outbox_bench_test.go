package store_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

const benchOutboxMessages = 10_000

// BenchmarkOutboxClaimSettle drains 10,000 due messages of one tenant per
// iteration with 1 and 2 claimers, each claiming 100 at a time and settling
// them (what a worker does after the HTTP answers, minus the HTTP): settle=
// single is one MarkDelivered (one durable commit) per message, settle=batch
// one SettleBatch per claim. It is the raw-SQL baseline for the worker's
// throughput; rows/s counts settled messages.
func BenchmarkOutboxClaimSettle(b *testing.B) {
	s, admin := benchStore(b)
	ctx := context.Background()
	tenant := fmt.Sprintf("bench-outbox-%d", time.Now().UnixNano()%1e9)
	seedOutbox(b, s, tenant)
	for _, c := range []struct {
		claimers int
		batch    bool
	}{{1, false}, {2, false}, {1, true}, {2, true}} {
		settle := map[bool]string{false: "single", true: "batch"}[c.batch]
		b.Run(fmt.Sprintf("claimers=%d/settle=%s", c.claimers, settle), func(b *testing.B) {
			var rows int64
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				resetOutbox(b, admin, tenant)
				b.StartTimer()
				start := time.Now()
				rows += drainOutbox(ctx, b, s, tenant, c.claimers, c.batch)
				elapsed += time.Since(start)
			}
			if rows != int64(b.N)*benchOutboxMessages {
				b.Fatalf("settled %d messages, want %d", rows, int64(b.N)*benchOutboxMessages)
			}
			b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
		})
	}
}

// seedOutbox enqueues envelopes of about 1 KiB to 100 endpoints: two topics
// of 50 (a topic holds at most MaxTopicEndpoints), each envelope to one topic.
func seedOutbox(b *testing.B, s *store.Store, tenant string) {
	b.Helper()
	ctx := context.Background()
	topics := []string{"bench-a", "bench-b"}
	for i := 0; i < 100; i++ {
		if _, err := s.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: tenant, ProjectID: "p1", Topic: topics[i%2],
			URL: "https://hooks.example.test/", SecretRef: tenant}); err != nil { // a secret ref belongs to one tenant
			b.Fatal(err)
		}
	}
	body := make([]byte, 512)
	for i := 0; i < benchOutboxMessages/50; i++ {
		_, err := s.Outbox().Enqueue(ctx, store.Actor{TenantID: tenant, DeviceID: "svc1", CorrelationID: "bench"}, store.EnqueueRequest{
			ProjectID: "p1", ProducerID: "svc1", Topic: topics[i%2], MaxAttempts: 12,
			IdempotencyDigest: sha256.Sum256([]byte(fmt.Sprint(i))), RequestDigest: sha256.Sum256([]byte(fmt.Sprint(i))),
			Build: func(seq int64) ([]byte, string, error) {
				if _, err := rand.Read(body); err != nil {
					return nil, "", err
				}
				ident := sha256.Sum256(body)
				return []byte(fmt.Sprintf(`{"payload":"%x","sequence":%d}`, body, seq)), hex.EncodeToString(ident[:]), nil
			},
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// resetOutbox makes every message of tenant due again, drops its attempt
// history (attempts count from 1 again, and each settle must write its row
// as on a first delivery) and vacuums, so each iteration starts from the
// same table shape.
func resetOutbox(b *testing.B, db *sql.DB, tenant string) {
	b.Helper()
	if _, err := db.Exec(`UPDATE outbox_messages SET status = 'pending', attempts = 0, next_attempt_at = now(),
		lease_expires_at = NULL, delivered_at = NULL, updated_at = now() WHERE tenant_id = $1`, tenant); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`DELETE FROM outbox_attempts WHERE tenant_id = $1`, tenant); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(`VACUUM ANALYZE outbox_messages, outbox_attempts`); err != nil {
		b.Fatal(err)
	}
}

func drainOutbox(ctx context.Context, b *testing.B, s *store.Store, tenant string, claimers int, batch bool) int64 {
	var settled atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				cs, err := s.Outbox().Claim(ctx, tenant, store.MaxClaim, time.Minute)
				if err != nil {
					failed.Store(err)
					return
				}
				if len(cs) == 0 {
					return
				}
				if batch {
					// Timed like the worker's: the history row takes the
					// caller's start, duration and status.
					ss := make([]store.Settlement, len(cs))
					for i, c := range cs {
						ss[i] = store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered,
							StartedAt: time.Now(), Duration: time.Millisecond, HTTPStatus: 204}
					}
					rs, err := s.Outbox().SettleBatch(ctx, tenant, ss)
					if err == nil {
						err = errors.Join(rs...)
					}
					if err != nil {
						failed.Store(err)
						return
					}
				} else {
					for _, c := range cs {
						if err := s.Outbox().MarkDelivered(ctx, tenant, c.MessageID, c.Attempt); err != nil {
							failed.Store(err)
							return
						}
					}
				}
				settled.Add(int64(len(cs)))
			}
		}()
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	return settled.Load()
}
