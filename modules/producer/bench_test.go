package producer

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// BenchmarkSend measures one Send against a service that answers at once,
// so what is left is the producer's own cost: signing, the state saves
// around the request (two fsynced file replacements with NewFileStore) and
// one loopback HTTP round trip. The batch100 variants send 100 events a
// request, which spreads the saves and the round trip over them.
func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodGet {
			io.WriteString(w, `{"cursor":0,"replay_floor":0}`)
			return
		}
		if r.URL.Path == wire.RouteBatch {
			io.WriteString(w, `{"results":[`+strings.Repeat(`{"outcome":"accepted","cursor":1,"correlation_id":"c","status":200},`, 99)+
				`{"outcome":"accepted","cursor":1,"correlation_id":"c","status":200}]}`)
			return
		}
		io.WriteString(w, `{"outcome":"accepted","cursor":1,"correlation_id":"c"}`)
	}))
	defer srv.Close()
	for _, bc := range []struct {
		name  string
		store func(b *testing.B) SequenceStore
	}{
		{"memory", func(*testing.B) SequenceStore { return &MemoryStore{} }},
		{"file", func(b *testing.B) SequenceStore { return NewFileStore(filepath.Join(b.TempDir(), "s.json")) }},
	} {
		b.Run(bc.name+"/batch100", func(b *testing.B) {
			p := newTestProducer(b, srv.URL, bc.store(b))
			evs := make([]Event, 100)
			for i := range evs {
				evs[i] = event(i)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.SendBatch(context.Background(), evs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(evs)), "ns/envelope")
		})
		b.Run(bc.name, func(b *testing.B) {
			p := newTestProducer(b, srv.URL, bc.store(b))
			ev := event(1)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Send(context.Background(), ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
