package server

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// Memory figures in these tests come from runtime.ReadMemStats in the test
// process, which runs the server, its clients and the test itself:
//
//   - "live" figures are taken right after runtime.GC(), so they count what
//     is still referenced (buffers held by blocked handlers), not garbage;
//   - "peak" figures are the highest HeapInuse seen by a goroutine sampling
//     every millisecond without forcing a collection, so they count garbage
//     too, as a pod's memory does.
//
// Both are reported as growth over a baseline taken after runtime.GC() just
// before the load starts. Run with -v to see them (docs/reliability.md,
// "Hostile load").

const mib = 1 << 20

func liveHeap() runtime.MemStats {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

func growthMiB(after, before uint64) float64 {
	return (float64(after) - float64(before)) / mib
}

// peakSampler records the highest HeapInuse until stopped.
type peakSampler struct {
	stop chan struct{}
	done chan struct{}
	peak atomic.Uint64
}

func samplePeak() *peakSampler {
	p := &peakSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > p.peak.Load() {
				p.peak.Store(m.HeapInuse)
			}
			select {
			case <-p.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

func (p *peakSampler) finish() uint64 {
	close(p.stop)
	<-p.done
	return p.peak.Load()
}

// TestStreamPageOfLargeEnvelopes reads a stream of 100 envelopes of about
// 1 MiB: every page holds at least one envelope and at most 4 MiB of
// envelope JSON, walking after returns each envelope once in order, and the
// reads never hold the whole stream in memory.
func TestStreamPageOfLargeEnvelopes(t *testing.T) {
	const n = 100
	f := newFixture(t)
	ctx := context.Background()
	actor := store.Actor{TenantID: tenantA, AccountID: "acct-1", DeviceID: deviceA, CorrelationID: "seed"}
	digests := make(map[int64][32]byte, n)
	// Seeded through the store in small groups, each decided by the same
	// steps 2-4 as a post, so the rows are exactly what the route serves.
	for first := int64(1); first <= n; first += 10 {
		var items []store.BatchItem
		for seq := first; seq < first+10; seq++ {
			d := draft(seq)
			d.Payload = []byte(`{"pad":"` + strings.Repeat("x", mib-1024) + `"}`)
			raw := f.sign(d)
			dec, err := f.srv.decide(ctx, actor, raw, idempotencyHeader{}, keyCache{}, nil, testNow)
			if err != nil || dec.refusal != nil {
				t.Fatalf("seed %d: %v %+v", seq, err, dec.refusal)
			}
			digests[seq] = sha256.Sum256(raw)
			items = append(items, dec.item)
		}
		res, err := f.st.IngestBatch(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Outcome != store.OutcomeAccepted {
				t.Fatalf("seed: %+v", r)
			}
		}
	}
	ts := httptest.NewServer(f.srv.Handler())
	defer ts.Close()
	client := ts.Client()

	read := func(after int64) (streamPage, int) {
		hr, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/v1/streams/%s/%s/envelopes?limit=100&after=%d", ts.URL, projectA, deviceA, after), nil)
		if err != nil {
			t.Fatal(err)
		}
		hr.Header.Set("Authorization", "Bearer "+f.service)
		res, err := client.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != 200 {
			b, _ := io.ReadAll(res.Body)
			t.Fatalf("read after %d: %d %s", after, res.StatusCode, b)
		}
		var page streamPage
		dec := json.NewDecoder(res.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&page); err != nil {
			t.Fatalf("read after %d: %v", after, err)
		}
		size := 0
		for _, e := range page.Envelopes {
			size += len(e.Envelope)
		}
		return page, size
	}

	before := liveHeap()
	sampler := samplePeak()
	var problems []string
	var after int64
	pages, largest := 0, 0
	for cursor := int64(-1); after != cursor; {
		page, size := read(after)
		envs := page.Envelopes
		cursor = page.Cursor
		pages++
		largest = max(largest, size)
		if cursor != n {
			t.Fatalf("cursor %d, want %d", cursor, n)
		}
		if len(envs) == 0 {
			t.Fatalf("an empty page after %d below the cursor", after)
		}
		if len(envs) > 1 && size > 4*mib {
			problems = append(problems, fmt.Sprintf("page after %d: %d envelopes, %d bytes of envelope JSON", after, len(envs), size))
		}
		for _, e := range envs {
			if e.Sequence != after+1 || e.PayloadExpired || sha256.Sum256(e.Envelope) != digests[e.Sequence] {
				t.Fatalf("after %d: got sequence %d (expired %v), or not the envelope as signed", after, e.Sequence, e.PayloadExpired)
			}
			after = e.Sequence
		}
	}
	peak := growthMiB(sampler.finish(), before.HeapInuse)
	t.Logf("%d envelopes of ~1 MiB read in %d pages (largest %.2f MiB of envelope JSON): peak HeapInuse +%.1f MiB",
		n, pages, float64(largest)/mib, peak)
	if after != n {
		t.Fatalf("walked to %d, want %d", after, n)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if peak >= 64 {
		t.Errorf("peak heap +%.1f MiB during the reads; want < 64 MiB", peak)
	}
}
