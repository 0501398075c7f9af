package producer

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// fakeService is enough of ingest-api's inbound routes to hold a producer
// to the contract: it verifies every envelope, keeps one stream (sequence →
// content digest, cursor) and answers as §2 does. Faults are injected per
// request. The real service is exercised by tools/internal/e2e.
type fakeService struct {
	t   *testing.T
	pub ed25519.PublicKey

	mu       sync.Mutex
	held     map[int64][32]byte
	events   map[string]int64
	cursor   int64
	bodies   [][]byte               // every envelope received, in order
	requests int                    // every request received
	faults   []func() (int, string) // consumed one per POST: status and Retry-After
	refuse   map[string]wire.Reason // event id → refusal
	// limitAfter, when > 0, answers batch items past this many with
	// rate_limited (the limiter running out part-way), once.
	limitAfter int
	// hangUps makes that many POSTs commit and then drop the connection
	// without an answer: the producer never learns what happened, as when
	// it is killed between a send and its answer.
	hangUps int
}

func newFakeService(t *testing.T, pub ed25519.PublicKey) (*fakeService, *httptest.Server) {
	f := &fakeService{t: t, pub: pub, held: map[int64][32]byte{}, events: map[string]int64{}, refuse: map[string]wire.Reason{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func (f *fakeService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	if r.Header.Get("Authorization") != "Bearer tok" {
		writeAnswer(w, wire.Answer{Outcome: wire.OutcomeRefused, Reason: wire.ReasonUnauthenticated})
		return
	}
	if r.Method == http.MethodGet && r.URL.Path == wire.StreamPath("proj-1", "device-7") {
		b, _ := json.Marshal(wire.StreamState{Cursor: f.cursor})
		w.Write(b)
		return
	}
	if len(f.faults) > 0 {
		status, retryAfter := f.faults[0]()
		f.faults = f.faults[1:]
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		reason := wire.ReasonUnavailable
		switch status {
		case http.StatusTooManyRequests:
			reason = wire.ReasonRateLimited
		case http.StatusRequestEntityTooLarge:
			reason = wire.ReasonBodyTooLarge
		}
		w.WriteHeader(status)
		b, _ := json.Marshal(wire.Answer{Outcome: wire.OutcomeRefused, Reason: reason})
		w.Write(b)
		return
	}
	body, _ := io.ReadAll(r.Body)
	switch r.URL.Path {
	case wire.RouteEnvelopes:
		a := f.ingest(body)
		if f.hangUps > 0 {
			f.hangUps--
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
			return
		}
		writeAnswer(w, a)
	case wire.RouteBatch:
		items, err := envelope.SplitBatch(body)
		if err != nil {
			writeAnswer(w, wire.Answer{Outcome: wire.OutcomeRefused, Reason: wire.ReasonInvalidEnvelope})
			return
		}
		var ba wire.BatchAnswer
		for i, it := range items {
			var a wire.Answer
			if f.limitAfter > 0 && i >= f.limitAfter {
				a = wire.Answer{Outcome: wire.OutcomeRefused, Reason: wire.ReasonRateLimited}
			} else {
				a = f.ingest(it)
			}
			ba.Results = append(ba.Results, wire.BatchResult{Answer: a, Status: a.Reason.Status()})
		}
		f.limitAfter = 0
		b, _ := json.Marshal(ba)
		w.Write(b)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func writeAnswer(w http.ResponseWriter, a wire.Answer) {
	a.CorrelationID = "c1"
	w.Header().Set(wire.HeaderCorrelationID, "c1")
	w.WriteHeader(a.Reason.Status())
	b, _ := json.Marshal(a)
	w.Write(b)
}

func (f *fakeService) ingest(body []byte) wire.Answer {
	f.bodies = append(f.bodies, bytes.Clone(body))
	refused := func(r wire.Reason) wire.Answer { return wire.Answer{Outcome: wire.OutcomeRefused, Reason: r} }
	e, err := envelope.Parse(body)
	if err != nil {
		return refused(wire.ReasonInvalidEnvelope)
	}
	if !bytes.Equal(e.Canonical(), body) {
		f.t.Errorf("envelope %d was not sent in canonical form", e.Sequence)
	}
	if err := e.Verify(f.pub); err != nil {
		return refused(wire.ReasonBadSignature)
	}
	if r, ok := f.refuse[e.EventID]; ok {
		return refused(r)
	}
	digest := e.ContentDigest()
	if seq, ok := f.events[e.EventID]; ok {
		if f.held[seq] == digest {
			c := f.cursor
			return wire.Answer{Outcome: wire.OutcomeDuplicate, EventIdentity: e.EventIdentity(), Cursor: &c}
		}
		return refused(wire.ReasonEventConflict)
	}
	if _, ok := f.held[e.Sequence]; ok {
		return refused(wire.ReasonSequenceConflict)
	}
	f.held[e.Sequence] = digest
	f.events[e.EventID] = e.Sequence
	for {
		if _, ok := f.held[f.cursor+1]; !ok {
			break
		}
		f.cursor++
	}
	c := f.cursor
	return wire.Answer{Outcome: wire.OutcomeAccepted, EventIdentity: e.EventIdentity(), Cursor: &c}
}

func (f *fakeService) snapshot() (cursor int64, held int, requests int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cursor, len(f.held), f.requests
}

func status(code int, retryAfter string) func() (int, string) {
	return func() (int, string) { return code, retryAfter }
}
