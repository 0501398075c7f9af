package store_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// benchStore opens the database named by STORE_BENCH_DSN (bench/run.sh points
// it and pgbench at the same database) or a fresh durable test database, and
// an admin pool on the same database.
func benchStore(b *testing.B) (*store.Store, *sql.DB) {
	b.Helper()
	ctx := context.Background()
	dsn := os.Getenv("STORE_BENCH_DSN")
	if dsn == "" {
		dsn = storetest.NewDatabase(b)
		storetest.Durable(b, dsn)
	}
	s, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 32})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	admin := storetest.AdminDB(b, dsn)
	if _, err := migrations.Apply(ctx, admin); err != nil {
		b.Fatal(err)
	}
	return s, admin
}

var benchRun atomic.Int64

// benchCanonical is a 1 KiB stored envelope, as pgbench's script stores.
var benchCanonical = bytes.Repeat([]byte("x"), 1024)

func benchInput(run int64, producer string, seq int64) store.IngestInput {
	id := fmt.Sprintf("e-%d-%s-%d", run, producer, seq)
	ident := sha256.Sum256([]byte(id))
	now := time.Now()
	return store.IngestInput{
		ProjectID: "p1", ProducerID: producer, EventIdentity: fmt.Sprintf("%x", ident), KeyID: "k1",
		IdempotencyDigest: sha256.Sum256([]byte("i-" + id)), ContentDigest: sha256.Sum256([]byte("c-" + id)),
		Sequence: seq, IssuedAt: now, Canonical: benchCanonical, ExpiresAt: now.Add(90 * 24 * time.Hour),
	}
}

// runProducers sends b.N envelopes from `producers` concurrent producers, each
// on its own stream in sequence order, singly (batch 1) or in batches.
func runProducers(b *testing.B, s *store.Store, producers, batch int) {
	run := benchRun.Add(1) + time.Now().UnixNano()
	runConcurrent(b, producers, func(p, per int) error {
		producer := fmt.Sprintf("bench-%d-%d", run%1e9, p)
		a := store.Actor{TenantID: "bench", AccountID: "a1", DeviceID: producer, CorrelationID: "bench"}
		items := make([]store.BatchItem, 0, batch)
		for seq := int64(1); seq <= int64(per); {
			items = items[:0]
			for ; len(items) < batch && seq <= int64(per); seq++ {
				in := benchInput(run, producer, seq)
				items = append(items, store.BatchItem{Actor: a, Ingest: &in})
			}
			rs, err := s.Inbound().IngestBatch(context.Background(), items)
			if err != nil {
				return err
			}
			if rs[len(rs)-1].Outcome != store.OutcomeAccepted {
				return fmt.Errorf("outcome %+v", rs[len(rs)-1])
			}
		}
		return nil
	})
}

// runConcurrent times producers goroutines, each calling work(p, per) for its
// share (per) of b.N envelopes, and reports envelopes/s; the first error
// fails the benchmark.
func runConcurrent(b *testing.B, producers int, work func(p, per int) error) {
	per := (b.N + producers - 1) / producers
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := work(p, per); err != nil {
				failed.Store(err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, ok := failed.Load().(error); ok {
		b.Fatal(err)
	}
	b.ReportMetric(float64(per*producers)/elapsed.Seconds(), "envelopes/s")
}

func BenchmarkIngest(b *testing.B) {
	s, _ := benchStore(b)
	for _, producers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("producers=%d", producers), func(b *testing.B) { runProducers(b, s, producers, 1) })
	}
}

func BenchmarkIngestBatch(b *testing.B) {
	s, _ := benchStore(b)
	for _, producers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("producers=%d/batch=100", producers), func(b *testing.B) { runProducers(b, s, producers, 100) })
	}
}
