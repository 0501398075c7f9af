package server

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
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
	// Twice: the first collection only moves sync.Pool contents (left by an
	// earlier test, or -count) to the victim cache; the second frees them,
	// so they are neither in the baseline nor freed during a measurement.
	runtime.GC()
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

// TestIdleDeclaredBodies: 300 connections declare a 1 MiB body and send
// nothing more. The server must not reserve memory for bytes that never
// came (contract §8.2), and a valid envelope on another connection is
// answered meanwhile.
func TestIdleDeclaredBodies(t *testing.T) {
	const conns = 300
	f := newFixture(t)
	var active atomic.Int64
	ts := httptest.NewUnstartedServer(f.srv.Handler())
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateActive {
			active.Add(1)
		}
	}
	ts.Start()
	defer ts.Close()
	// Warm the server's pools and caches so the baseline holds them.
	if r := overHTTP(t, ts, req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(1))}); r.status != 200 {
		t.Fatalf("warm-up: %d %s", r.status, r.body)
	}
	active.Store(0)

	before := liveHeap()
	idle := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range idle {
			_ = c.Close()
		}
	}()
	head := "POST /v1/envelopes HTTP/1.1\r\nHost: ingest\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"
	for range conns {
		c, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); active.Load() < conns; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d connections reached the server", active.Load(), conns)
		}
	}

	// Wait until every handler is blocked reading its body, holding its
	// first chunk. Not fatal here: code that sizes buffers from the
	// declared length is caught by the heap check below.
	var held int64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if held = f.heldBodyBytes(); held == conns*firstBodyChunk {
			break
		}
	}

	start := time.Now()
	r := overHTTP(t, ts, req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(2))})
	took := time.Since(start)
	wantAnswer(t, r, 200, "accepted", "", 2)

	// Sample the live heap for a while and keep the largest growth.
	var inuse, alloc float64
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		m := liveHeap()
		inuse = max(inuse, growthMiB(m.HeapInuse, before.HeapInuse))
		alloc = max(alloc, growthMiB(m.HeapAlloc, before.HeapAlloc))
	}
	t.Logf("%d idle connections declaring 1 MiB: live heap +%.1f MiB HeapInuse, +%.1f MiB HeapAlloc; a valid envelope answered in %v",
		conns, inuse, alloc, took.Round(time.Millisecond))
	if inuse >= 16 || alloc >= 16 {
		t.Errorf("heap grew by %.1f MiB in use, %.1f MiB allocated; want < 16 MiB", inuse, alloc)
	}
	if held != conns*firstBodyChunk {
		t.Errorf("%d body bytes held by %d idle requests, want %d", held, conns, conns*firstBodyChunk)
	}
	if took >= time.Second {
		t.Errorf("a valid envelope took %v beside idle connections; want < 1s", took)
	}
}

// signPadded is draft(seq) signed with the payload {"pad":"xx…"} of pad
// bytes. envelope.Sign would canonicalize the whole megabyte, seconds per
// envelope under -race; instead the padding, plain ASCII inside one string,
// is spliced into the canonical form of a small draft, which keeps it
// canonical, and only the signature is made again. decide then checks the
// result as it checks a post.
func (f *fixture) signPadded(seq int64, pad int) []byte {
	const sigMember = `,"signature":"`
	d := draft(seq)
	d.Payload = []byte(`{"pad":""}`)
	small := f.sign(d)
	// "payload" sorts before "signature", so the member moves by pad bytes.
	i := bytes.Index(small, []byte(sigMember))
	j := i + len(sigMember) + bytes.IndexByte(small[i+len(sigMember):], '"') + 1
	unsigned := bytes.Replace(slices.Concat(small[:i], small[j:]), []byte(`{"pad":""}`),
		[]byte(`{"pad":"`+strings.Repeat("x", pad)+`"}`), 1)
	sig := ed25519.Sign(f.priv, slices.Concat([]byte(envelope.SigningPrefix), unsigned))
	return slices.Concat(unsigned[:i+pad], []byte(sigMember+b64url(sig)+`"`), unsigned[i+pad:])
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
			raw := f.signPadded(seq, mib-1024)
			dec, err := f.srv.decide(ctx, actor, raw, idempotencyHeader{}, keyCache{}, nil, testNow)
			if err != nil || dec.refusal != nil {
				t.Fatalf("seed %d: %v %+v", seq, err, dec.refusal)
			}
			digests[seq] = sha256.Sum256(raw)
			items = append(items, dec.item)
		}
		res, err := f.st.Inbound().IngestBatch(ctx, items)
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
