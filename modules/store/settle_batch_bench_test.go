package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// BenchmarkSettleBatchSize times one SettleBatch of n claimed messages per
// iteration, n from 1 to MaxSettleBatch, to show whether settleSQL's cost
// per message grows with the batch (a per-row lookup into the batch would
// make the statement quadratic). Only the settle is timed: the claims
// before it, and the reset that makes the seeded messages due again once
// fewer than n are left, are not. ns/msg is the figure to compare across
// sizes.
func BenchmarkSettleBatchSize(b *testing.B) {
	s, admin := benchStore(b)
	ctx := context.Background()
	tenant := fmt.Sprintf("bench-settle-%d", time.Now().UnixNano()%1e9)
	seedOutbox(b, s, tenant)
	for _, n := range []int{1, 10, 100, 500, store.MaxSettleBatch} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			b.StopTimer()
			resetOutbox(b, admin, tenant)
			left := benchOutboxMessages
			var elapsed time.Duration
			for i := 0; i < b.N; i++ {
				if left < n {
					resetOutbox(b, admin, tenant)
					left = benchOutboxMessages
				}
				ss := claimForSettle(ctx, b, s, tenant, n)
				left -= n
				b.StartTimer()
				start := time.Now()
				rs, err := s.Outbox().SettleBatch(ctx, tenant, ss)
				elapsed += time.Since(start)
				b.StopTimer()
				if err == nil {
					err = errors.Join(rs...)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N*n), "ns/msg")
		})
	}
}

// claimForSettle claims exactly n due messages of tenant (in claims of at
// most MaxClaim) and returns their delivered settles, timed as the worker's.
func claimForSettle(ctx context.Context, b *testing.B, s *store.Store, tenant string, n int) []store.Settlement {
	b.Helper()
	ss := make([]store.Settlement, 0, n)
	for len(ss) < n {
		cs, err := s.Outbox().Claim(ctx, tenant, min(store.MaxClaim, n-len(ss)), time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if len(cs) == 0 {
			b.Fatalf("claimed %d of %d messages: none due", len(ss), n)
		}
		for _, c := range cs {
			ss = append(ss, store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Outcome: store.SettleDelivered,
				StartedAt: time.Now(), Duration: time.Millisecond, HTTPStatus: 204})
		}
	}
	return ss
}
