package worker

import (
	"context"
	"sync"
	"testing"
)

// BenchmarkDeliver measures claim + signed HTTP attempt + settle per message
// through PostgreSQL and a loopback receiver, one worker, 16 slots.
func BenchmarkDeliver(b *testing.B) {
	e := newEnv(b)
	rc := newReceiver(b, nil)
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	for range b.N {
		e.enqueue("t1", "orders", 12)
	}
	w, _ := newWorker(b, e.dsn, opts{concurrency: 16})
	b.ResetTimer()
	delivered := 0
	for delivered < b.N {
		var wg sync.WaitGroup
		n, err := w.Cycle(context.Background(), context.Background(), &wg)
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		delivered += n
	}
	b.StopTimer()
	if got := e.count(`SELECT count(*) FROM outbox_messages WHERE status = 'delivered'`); got != b.N {
		b.Fatalf("%d delivered, want %d", got, b.N)
	}
}
