package server

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// benchProducers is the concurrency of the ingest benchmarks: 64 producers,
// each its own device credential and stream.
const benchProducers = 64

type benchEnv struct {
	f      *fixture
	tokens []string
}

func newBenchEnv(b *testing.B, edit ...func(*Config)) *benchEnv {
	f := newFixture(b, edit...)
	// Benchmarks measure durable commits, as pgbench would.
	storetest.Durable(b, f.dsn)
	// The service's default pool size (DB_MAX_OPEN_CONNS), not storetest's.
	st, err := store.Open(context.Background(), f.dsn, store.Options{MaxOpenConns: 32})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	cfg := testConfig()
	// Throughput, not deadlines, is measured: on a small shared machine a
	// 100-item batch can wait seconds for a connection at 64 producers.
	cfg.StoreTimeout = time.Minute
	for _, e := range edit {
		e(&cfg)
	}
	f.srv = f.newServer(cfg, st)
	e := &benchEnv{f: f, tokens: make([]string, benchProducers)}
	for i := range e.tokens {
		e.tokens[i] = f.issue(tenantA, "acct-b", fmt.Sprintf("bench-%d", i), store.RoleDevice)
	}
	return e
}

func (e *benchEnv) signFor(b *testing.B, dev int, seq int64) []byte {
	d := draft(seq)
	d.ProducerID = fmt.Sprintf("bench-%d", dev)
	d.EventID = fmt.Sprintf("evt-%d-%d", dev, seq)
	d.IdempotencyKey = fmt.Sprintf("idem-%d-%d", dev, seq)
	d.Payload = []byte(`{"progress":0.5,"state":"running","note":"benchmark envelope"}`)
	return signWith(b, e.f.priv, d)
}

func (e *benchEnv) serve(b *testing.B, path, token string, body []byte) {
	hr := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	hr.RemoteAddr = clientIP + ":40000"
	hr.Header.Set("Authorization", "Bearer "+token)
	w := httptest.NewRecorder()
	e.f.srv.Handler().ServeHTTP(w, hr)
	if w.Code != 200 {
		b.Errorf("status %d: %s", w.Code, w.Body.Bytes())
		for _, line := range strings.Split(e.f.logs.String(), "\n") {
			if strings.Contains(line, "dependency failed") {
				b.Log(line)
			}
		}
	}
}

// run makes each of the 64 producers send its own requests in order, one
// at a time, as a device does (the next only after the answer), and returns
// the elapsed time. reqs[p] are producer p's request bodies.
func (e *benchEnv) run(b *testing.B, path string, reqs [][][]byte) time.Duration {
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range benchProducers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, body := range reqs[p] {
				e.serve(b, path, e.tokens[p], body)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	return elapsed
}

// BenchmarkIngestSingle: POST /v1/envelopes from 64 concurrent producers
// (b.N requests in all) through the in-process handler, against PostgreSQL
// with durable commits. "grouped" is the default group commit; "ungrouped"
// commits each request in its own transaction with 64 in flight
// (GROUP_COMMIT_MAX_ITEMS=1), the one-transaction-per-envelope base.
func BenchmarkIngestSingle(b *testing.B) {
	for _, tc := range []struct {
		name      string
		max, conc int
	}{{"grouped", 100, 0}, {"ungrouped", 1, benchProducers}} {
		b.Run(tc.name, func(b *testing.B) {
			e := newBenchEnv(b, func(c *Config) {
				c.GroupCommitMaxItems = tc.max
				c.GroupCommitConcurrency = tc.conc
				c.CredentialCacheTTL = time.Second
			})
			per := (b.N + benchProducers - 1) / benchProducers
			reqs := make([][][]byte, benchProducers)
			for p := range reqs {
				for seq := 1; seq <= per; seq++ {
					reqs[p] = append(reqs[p], e.signFor(b, p, int64(seq)))
				}
			}
			elapsed := e.run(b, "/v1/envelopes", reqs)
			b.ReportMetric(float64(per*benchProducers)/elapsed.Seconds(), "envelopes/s")
		})
	}
}

// BenchmarkIngestBatch: POST /v1/envelopes/batch with 100 envelopes of one
// producer per request, 64 producers concurrently; b.N requests in all.
func BenchmarkIngestBatch(b *testing.B) {
	const perBatch = 100
	e := newBenchEnv(b, func(c *Config) { c.CredentialCacheTTL = time.Second })
	per := (b.N + benchProducers - 1) / benchProducers
	reqs := make([][][]byte, benchProducers)
	for p := range reqs {
		for k := range per {
			items := make([][]byte, perBatch)
			for j := range items {
				items[j] = e.signFor(b, p, int64(k*perBatch+j+1))
			}
			reqs[p] = append(reqs[p], batchBody(items...))
		}
	}
	elapsed := e.run(b, "/v1/envelopes/batch", reqs)
	b.ReportMetric(float64(per*benchProducers*perBatch)/elapsed.Seconds(), "envelopes/s")
}

// BenchmarkOutboxEnqueue: POST /v1/outbox over HTTP in process, each
// request a new idempotency key fanned out to the fixture's two active
// endpoints, durable commits. Parallel callers use 16 service credentials
// (16 outbound streams); one stream serializes on its lock by design.
func BenchmarkOutboxEnqueue(b *testing.B) {
	for _, producers := range []int{1, 16} {
		b.Run(fmt.Sprintf("producers=%d", producers), func(b *testing.B) {
			o := newOutboxFixture(b)
			storetest.Durable(b, o.dsn)
			tokens := make([]string, producers)
			for i := range tokens {
				tokens[i] = o.issue(tenantA, "acct-b", fmt.Sprintf("svc-b%d", i), store.RoleService)
			}
			var callers, keys atomic.Int64
			// SetParallelism multiplies GOMAXPROCS: at least one caller per
			// producer on 2+ CPUs.
			b.SetParallelism((producers + 1) / 2)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				tok := tokens[int(callers.Add(1)-1)%producers]
				for pb.Next() {
					body := outboxBody(fmt.Sprintf("bench-%d", keys.Add(1)), "benchmark")
					hr := httptest.NewRequest(http.MethodPost, "/v1/outbox", bytes.NewReader(body))
					hr.RemoteAddr = clientIP + ":40000"
					hr.Header.Set("Authorization", "Bearer "+tok)
					w := httptest.NewRecorder()
					o.srv.Handler().ServeHTTP(w, hr)
					if w.Code != http.StatusCreated {
						b.Errorf("status %d: %s", w.Code, w.Body.String())
						return
					}
				}
			})
		})
	}
}
