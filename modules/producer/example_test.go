package producer_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// demoService stands in for ingest-api: it reads the stream state and
// accepts every envelope, answering with the contract's body.
func demoService() *httptest.Server {
	var cursor int64
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			json.NewEncoder(w).Encode(wire.StreamState{Cursor: cursor})
			return
		}
		body, _ := io.ReadAll(r.Body)
		n := int64(strings.Count(string(body), `"signature"`))
		var results []wire.BatchResult
		for range n {
			cursor++
			c := cursor
			results = append(results, wire.BatchResult{Answer: wire.Answer{Outcome: wire.OutcomeAccepted, Cursor: &c}, Status: 200})
		}
		if r.URL.Path == wire.RouteBatch {
			json.NewEncoder(w).Encode(wire.BatchAnswer{Results: results})
			return
		}
		json.NewEncoder(w).Encode(results[0].Answer)
	}))
}

// A device signs and sends events; the producer assigns sequences, saves
// each envelope before sending it and retries only what is safe to retry.
func Example() {
	srv := demoService()
	defer srv.Close()
	dir, _ := os.MkdirTemp("", "producer-example")
	defer os.RemoveAll(dir)

	// The device's key, registered with `envctl key add`; in real use its
	// seed comes from the device's secure storage.
	seed := make([]byte, ed25519.SeedSize)
	signer, err := envelope.NewSigner("device-7-k1", ed25519.NewKeyFromSeed(seed))
	if err != nil {
		log.Fatal(err)
	}
	p, err := producer.New(srv.URL, "token-from-envctl-credential-issue", signer,
		producer.WithStream(producer.Stream{TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7"}),
		producer.WithStore(producer.NewFileStore(filepath.Join(dir, "proj-1.json"))))
	if err != nil {
		log.Fatal(err)
	}
	r, err := p.Send(context.Background(), producer.Event{
		EventID:  "evt-0001",
		Metadata: envelope.Metadata{Kind: "task.status"},
		Payload:  []byte(`{"state":"running","progress":0.5}`),
	})
	if err != nil {
		log.Fatal(err) // a local rule breach, or producer.ErrUndelivered
	}
	fmt.Println(r.Sequence, r.Outcome, r.Cursor)
	// Output: 1 accepted 1
}

// After a restart, Resume re-sends what had no answer and continues above
// the service's cursor; results are per envelope, in order.
func ExampleProducer_SendBatch() {
	srv := demoService()
	defer srv.Close()
	signer, _ := envelope.NewSigner("k1", ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	p, _ := producer.New(srv.URL, "token", signer,
		producer.WithStream(producer.Stream{TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7"}),
		producer.WithStore(&producer.MemoryStore{}))
	if _, err := p.Resume(context.Background()); err != nil {
		log.Fatal(err)
	}
	var evs []producer.Event
	for i := 1; i <= 3; i++ {
		evs = append(evs, producer.Event{
			EventID:  fmt.Sprintf("evt-%d", i),
			Metadata: envelope.Metadata{Kind: "reading"},
			Payload:  []byte(fmt.Sprint(i)),
		})
	}
	results, err := p.SendBatch(context.Background(), evs)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range results {
		switch {
		case r.Delivered():
			fmt.Println(r.Sequence, "delivered")
		default:
			fmt.Println(r.Sequence, "refused:", r.Reason) // e.g. wire.ReasonEventConflict
		}
	}
	// Output:
	// 1 delivered
	// 2 delivered
	// 3 delivered
}

// WithObserver shows every exchange behind one Send: here a 503 the
// producer retried, then the answer. A test harness or a metrics hook can
// count answers this way; the credential and bodies are never reported.
func ExampleWithObserver() {
	failed := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet:
			json.NewEncoder(w).Encode(wire.StreamState{})
		case !failed:
			failed = true
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(wire.Answer{Outcome: wire.OutcomeRefused, Reason: wire.ReasonUnavailable})
		default:
			c := int64(1)
			json.NewEncoder(w).Encode(wire.Answer{Outcome: wire.OutcomeAccepted, Cursor: &c})
		}
	}))
	defer srv.Close()
	signer, _ := envelope.NewSigner("k1", ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize)))
	p, _ := producer.New(srv.URL, "token", signer,
		producer.WithStream(producer.Stream{TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7"}),
		producer.WithStore(&producer.MemoryStore{}),
		producer.WithBackoff(time.Millisecond, time.Millisecond),
		producer.WithObserver(func(a producer.Attempt) {
			fmt.Println(a.Method, a.Route, a.Sequences, a.Status, a.Answer.Outcome, a.Answer.Reason, "retry:", a.Retry)
		}))
	if _, err := p.Send(context.Background(), producer.Event{
		EventID: "evt-1", Metadata: envelope.Metadata{Kind: "reading"}, Payload: []byte(`1`),
	}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// GET /v1/streams/proj-1/device-7 [] 200   retry: false
	// POST /v1/envelopes [1] 503 refused unavailable retry: true
	// POST /v1/envelopes [1] 200 accepted  retry: false
}
