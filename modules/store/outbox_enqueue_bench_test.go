package store_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// BenchmarkOutboxEnqueue enqueues b.N envelopes of about 1 KiB, each to a
// topic of four endpoints (four messages), one Enqueue (one transaction)
// per envelope, from `producers` concurrent service devices, each its own
// outbound stream. It times the enqueue pipeline (outbox_batch.go) the way
// POST /v1/outbox drives it, minus HTTP and signing.
func BenchmarkOutboxEnqueue(b *testing.B) {
	s, _ := benchStore(b)
	ctx := context.Background()
	tenant := fmt.Sprintf("bench-enqueue-%d", time.Now().UnixNano()%1e9)
	for range 4 {
		if _, err := s.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: tenant, ProjectID: "p1", Topic: "bench",
			URL: "https://hooks.example.test/", SecretRef: tenant}); err != nil {
			b.Fatal(err)
		}
	}
	for _, producers := range []int{1, 4} {
		b.Run(fmt.Sprintf("producers=%d", producers), func(b *testing.B) {
			run := benchRun.Add(1)
			runConcurrent(b, producers, func(p, per int) error {
				device := fmt.Sprintf("svc-%d-%d", run, p)
				a := store.Actor{TenantID: tenant, DeviceID: device, CorrelationID: "bench"}
				for i := range per {
					key := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", device, i)))
					_, err := s.Outbox().Enqueue(ctx, a, store.EnqueueRequest{ProjectID: "p1", ProducerID: device, Topic: "bench",
						MaxAttempts: 12, IdempotencyDigest: key, RequestDigest: key,
						Build: func(seq int64) ([]byte, string, error) {
							return fmt.Appendf(nil, `{"payload":"%x","sequence":%d}`, benchCanonical[:512], seq),
								hex.EncodeToString(key[:]), nil
						}})
					if err != nil {
						return err
					}
				}
				return nil
			})
		})
	}
}
