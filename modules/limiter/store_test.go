package limiter

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
)

// fakeClock is a settable clock shared by a store and a Limiter.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newStore(t *testing.T, p Policy, opts ...StoreOption) *MemoryStore {
	t.Helper()
	s, err := NewMemoryStore(p, opts...)
	if err != nil {
		t.Fatalf("NewMemoryStore(%+v): %v", p, err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// drain takes until refused and returns how many were allowed and the
// refusal's reset (Unix ns).
func drain(t *testing.T, s *MemoryStore, key string) (allowed uint64, reset uint64) {
	t.Helper()
	for {
		_, _, r, ok, err := s.Take(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return allowed, r
		}
		allowed++
	}
}

// refilled is floor(elapsed·tokens/interval), computed independently of the
// store's arithmetic.
func refilled(p Policy, elapsed time.Duration) uint64 {
	n := new(big.Int).Mul(big.NewInt(int64(elapsed)), new(big.Int).SetUint64(p.Tokens))
	n.Quo(n, big.NewInt(int64(p.Interval)))
	return min(n.Uint64(), p.Tokens)
}

// waitFor is how long after elapsed (since the bucket was empty) the next
// whole token arrives: ceil(k·interval/tokens) − elapsed for the next k.
func waitFor(p Policy, elapsed time.Duration) time.Duration {
	k := new(big.Int).SetUint64(refilled(p, elapsed) + 1)
	k.Mul(k, big.NewInt(int64(p.Interval)))
	tok := new(big.Int).SetUint64(p.Tokens)
	k.Add(k, tok).Sub(k, big.NewInt(1)).Quo(k, tok)
	return time.Duration(k.Int64()) - elapsed
}

// TestStoreExactRefill drains a bucket, then refills it in uneven parts and
// checks every count, the carried remainder and every reset to the
// nanosecond, at the edges of the policy range.
func TestStoreExactRefill(t *testing.T) {
	for _, p := range []Policy{
		{Tokens: 1, Interval: time.Second},
		{Tokens: 31_623, Interval: time.Second},
		{Tokens: 1_000_000, Interval: time.Second},
		{Tokens: 1, Interval: time.Hour},
		{Tokens: 31_623, Interval: time.Hour},
		{Tokens: 1_000_000, Interval: time.Hour},
		{Tokens: 7, Interval: time.Hour},
		{Tokens: 1_000_000, Interval: time.Millisecond},
	} {
		t.Run(fmt.Sprintf("%d per %s", p.Tokens, p.Interval), func(t *testing.T) {
			clock := newFakeClock()
			s := newStore(t, p, WithStoreClock(clock.Now))
			const key = "k"
			if got, reset := drain(t, s, key); got != p.Tokens {
				t.Fatalf("a new bucket allowed %d, want %d", got, p.Tokens)
			} else if want := clock.Now().Add(waitFor(p, 0)); reset != uint64(want.UnixNano()) {
				t.Fatalf("reset of the empty bucket %v after now, want %v", time.Duration(reset)-time.Duration(clock.Now().UnixNano()), waitFor(p, 0))
			}
			// Uneven steps that do not divide the interval; together exactly one interval.
			steps := []time.Duration{p.Interval / 3, p.Interval/3 + 7, 1, p.Interval - 2*(p.Interval/3) - 8}
			var elapsed time.Duration
			var total uint64
			for i, step := range steps {
				clock.Advance(step)
				elapsed += step
				want := refilled(p, elapsed) - total
				if _, rem, err := s.Get(context.Background(), key); err != nil || rem != want {
					t.Fatalf("step %d: Get remaining %d, %v; want %d", i, rem, err, want)
				}
				got, reset := drain(t, s, key)
				if got != want {
					t.Fatalf("step %d (%v after empty): allowed %d, want %d", i, elapsed, got, want)
				}
				total += got
				if elapsed < p.Interval {
					if want := clock.Now().Add(waitFor(p, elapsed)); reset != uint64(want.UnixNano()) {
						t.Fatalf("step %d: reset in %v, want %v", i, time.Duration(int64(reset)-clock.Now().UnixNano()), waitFor(p, elapsed))
					}
				}
			}
			if total != p.Tokens {
				t.Fatalf("one interval refilled %d tokens, want %d", total, p.Tokens)
			}
			// Idle for many intervals: full, never more.
			clock.Advance(10 * p.Interval)
			if got, _ := drain(t, s, key); got != p.Tokens {
				t.Fatalf("after idling allowed %d, want %d", got, p.Tokens)
			}
		})
	}
}

// TestRetryAfterOfTheNewRefill checks Retry-After through the Limiter: the
// time until one token is available, in whole seconds rounded up, never 0.
func TestRetryAfterOfTheNewRefill(t *testing.T) {
	cases := []struct {
		p       Policy
		advance time.Duration // after draining
		want    time.Duration
	}{
		{Policy{1, time.Hour}, 0, time.Hour},
		{Policy{1, time.Hour}, 1800 * time.Second, 1800 * time.Second},
		{Policy{1, time.Hour}, 1800*time.Second + 1, 1800 * time.Second},
		{Policy{1, time.Hour}, 1800*time.Second - 1, 1801 * time.Second},
		{Policy{7, time.Hour}, 0, 515 * time.Second}, // 514.29 s
		{Policy{2, 90 * time.Minute}, 0, 45 * time.Minute},
		{Policy{31_623, time.Hour}, 0, time.Second}, // 113.8 ms
		{Policy{1_000_000, time.Hour}, 0, time.Second},
		{Policy{1, time.Second}, 0, time.Second},
		{Policy{31_623, time.Second}, 0, time.Second},
		{Policy{1_000_000, time.Second}, 0, time.Second},
		{Policy{1, 2500 * time.Millisecond}, 0, 3 * time.Second},
		{Policy{1, 2500 * time.Millisecond}, 1500 * time.Millisecond, time.Second},
	}
	for _, c := range cases {
		clock := newFakeClock()
		l, err := New[DeliveryKey](c.p, WithClock(clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		k := DeliveryKey{Tenant: "t"}
		for range c.p.Tokens {
			if d, err := l.Take(context.Background(), k); err != nil || !d.Allowed {
				t.Fatalf("%+v: take = %+v, %v", c.p, d, err)
			}
		}
		clock.Advance(c.advance)
		d, err := l.Take(context.Background(), k)
		if err != nil || d.Allowed {
			t.Fatalf("%+v: take after draining = %+v, %v; want refusal", c.p, d, err)
		}
		if d.RetryAfter != c.want {
			t.Errorf("%+v, %v after draining: RetryAfter %v, want %v", c.p, c.advance, d.RetryAfter, c.want)
		}
		// Honouring it succeeds.
		clock.Advance(d.RetryAfter)
		if d, err := l.Take(context.Background(), k); err != nil || !d.Allowed {
			t.Errorf("%+v: take after Retry-After = %+v, %v", c.p, d, err)
		}
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStoreSweepDropsOnlyFullBuckets(t *testing.T) {
	clock := newFakeClock()
	p := Policy{Tokens: 4, Interval: time.Hour}
	s := newStore(t, p, WithStoreClock(clock.Now), WithSweepInterval(time.Hour))
	ctx := context.Background()
	for i := range 100 {
		if _, _, _, ok, err := s.Take(ctx, fmt.Sprint("k", i)); err != nil || !ok {
			t.Fatalf("take %d: %v %v", i, ok, err)
		}
	}
	// k0 is emptied and refilled in part: not full, so kept.
	drain(t, s, "k0")
	if err := s.Set(ctx, "pinned", 2, time.Minute); err != nil {
		t.Fatal(err)
	}
	s.sweep()
	if n := s.Len(); n != 101 {
		t.Fatalf("%d buckets after a sweep of partly spent ones, want 101", n)
	}
	clock.Advance(p.Interval / 4) // one token back: k1..k99 full again, k0 holds 1
	s.sweep()
	if n := s.Len(); n != 2 {
		t.Fatalf("%d buckets after the sweep, want 2 (k0 and the pinned one)", n)
	}
	if _, rem, _ := s.Get(ctx, "k0"); rem != 1 {
		t.Fatalf("k0 remaining %d, want 1", rem)
	}
	// A returning key gets a full bucket.
	if _, rem, _, ok, _ := s.Take(ctx, "k5"); !ok || rem != p.Tokens-1 {
		t.Fatalf("returning key: ok %v remaining %d, want %d", ok, rem, p.Tokens-1)
	}
	clock.Advance(p.Interval)
	s.sweep()
	if n := s.Len(); n != 1 {
		t.Fatalf("%d buckets left, want only the pinned one", n)
	}
	if tok, rem, _ := s.Get(ctx, "pinned"); tok != 2 || rem != 2 {
		t.Fatalf("pinned key = %d/%d, want its own policy 2/2", rem, tok)
	}
}

// TestStoreSweeperReleasesMemory runs the real sweeper goroutine over many
// keys and checks that the heap they took is given back.
func TestStoreSweeperReleasesMemory(t *testing.T) {
	clock := newFakeClock()
	p := Policy{Tokens: 10, Interval: time.Second}
	s := newStore(t, p, WithStoreClock(clock.Now), WithSweepInterval(5*time.Millisecond))
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const keys = 200_000
	before := heap()
	var k [32]byte
	for i := range keys {
		k[0], k[1], k[2] = byte(i), byte(i>>8), byte(i>>16)
		if _, _, _, ok, err := s.Take(ctx, string(k[:])); err != nil || !ok {
			t.Fatal(ok, err)
		}
	}
	if n := s.Len(); n != keys {
		t.Fatalf("%d buckets, want %d", n, keys)
	}
	full := heap()
	clock.Advance(p.Interval)
	deadline := time.Now().Add(30 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d buckets left 30s after they were full", s.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A sweep may still be rebuilding a shard's map; one more period ends it.
	time.Sleep(50 * time.Millisecond)
	after := heap()
	grown := full - before
	t.Logf("heap: %d B before, %d B with %d keys, %d B after the sweep", before, full, keys, after)
	if grown < keys*32 {
		t.Fatalf("heap grew only %d B for %d keys: the measurement is off", grown, keys)
	}
	if after > before+grown/8 {
		t.Fatalf("heap %d B after the sweep; %d B before the keys and %d B with them: not released", after, before, full)
	}
	if _, rem, _, ok, _ := s.Take(ctx, string(k[:])); !ok || rem != p.Tokens-1 {
		t.Fatalf("returning key: ok %v remaining %d", ok, rem)
	}
}

func TestStoreGetSetBurst(t *testing.T) {
	clock := newFakeClock()
	p := Policy{Tokens: 3, Interval: time.Minute}
	s := newStore(t, p, WithStoreClock(clock.Now))
	ctx := context.Background()
	if tok, rem, err := s.Get(ctx, "new"); err != nil || tok != 3 || rem != 3 {
		t.Fatalf("Get of an unknown key = %d, %d, %v; want a full bucket", tok, rem, err)
	}
	if s.Len() != 0 {
		t.Fatal("Get created a bucket")
	}
	s.Take(ctx, "a")
	for range 2 { // Get changes nothing
		if tok, rem, err := s.Get(ctx, "a"); err != nil || tok != 3 || rem != 2 {
			t.Fatalf("Get = %d, %d, %v; want 3, 2", tok, rem, err)
		}
	}

	// Set: its own policy, a full bucket, replacing what was there.
	if err := s.Set(ctx, "a", 5, time.Hour); err != nil {
		t.Fatal(err)
	}
	if got, _ := drain(t, s, "a"); got != 5 {
		t.Fatalf("after Set allowed %d, want 5", got)
	}
	clock.Advance(12 * time.Minute)
	if _, rem, _ := s.Get(ctx, "a"); rem != 1 {
		t.Fatalf("Set policy refilled %d in 12 min, want 1 (5/h)", rem)
	}
	for _, bad := range []Policy{{0, time.Hour}, {MaxTokens + 1, time.Hour}, {1, time.Microsecond}} {
		if err := s.Set(ctx, "b", bad.Tokens, bad.Interval); !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("Set(%+v) = %v, want ErrInvalidPolicy", bad, err)
		}
	}

	// Burst: beyond capacity, spent first, lapsing after one interval.
	if err := s.Burst(ctx, "c", 2); err != nil {
		t.Fatal(err)
	}
	if _, rem, _ := s.Get(ctx, "c"); rem != 5 {
		t.Fatalf("a new key's burst: %d remaining, want 3+2", rem)
	}
	if got, _ := drain(t, s, "c"); got != 5 {
		t.Fatalf("burst bucket allowed %d, want 5", got)
	}
	clock.Advance(p.Interval / 3) // one token back
	if err := s.Burst(ctx, "c", 10); err != nil {
		t.Fatal(err)
	}
	if _, rem, _ := s.Get(ctx, "c"); rem != 11 {
		t.Fatalf("after Burst(10): %d remaining, want 11", rem)
	}
	s.Take(ctx, "c")
	clock.Advance(p.Interval - 1)
	if _, rem, _ := s.Get(ctx, "c"); rem != 10 {
		t.Fatalf("burst tokens before the interval ends: %d, want 10", rem)
	}
	clock.Advance(1)
	if _, rem, _ := s.Get(ctx, "c"); rem != 3 {
		t.Fatalf("burst tokens after the interval: %d, want capacity 3", rem)
	}
}

func TestStoreClose(t *testing.T) {
	s, err := NewMemoryStore(Policy{Tokens: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.Take(ctx, "a")
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if tok, rem, reset, ok, err := s.Take(ctx, "a"); !errors.Is(err, golimiter.ErrStopped) || ok || tok != 0 || rem != 0 || reset != 0 {
		t.Fatalf("Take after Close = %d %d %d %v %v; want zero values and ErrStopped", tok, rem, reset, ok, err)
	}
	if _, _, err := s.Get(ctx, "a"); !errors.Is(err, golimiter.ErrStopped) {
		t.Fatalf("Get after Close: %v", err)
	}
	if err := s.Set(ctx, "a", 1, time.Second); !errors.Is(err, golimiter.ErrStopped) {
		t.Fatalf("Set after Close: %v", err)
	}
	if err := s.Burst(ctx, "a", 1); !errors.Is(err, golimiter.ErrStopped) {
		t.Fatalf("Burst after Close: %v", err)
	}
	if s.Len() != 0 {
		t.Fatal("Close kept buckets")
	}
}

// TestStoreConcurrentTakesAreExact: many goroutines on shared and own keys
// never get more than the policy allows (run with -race).
func TestStoreConcurrentTakesAreExact(t *testing.T) {
	clock := newFakeClock()
	p := Policy{Tokens: 1000, Interval: time.Hour}
	s := newStore(t, p, WithStoreClock(clock.Now), WithSweepInterval(time.Millisecond))
	ctx := context.Background()
	const workers, perWorker = 8, 600
	var shared atomic.Uint64
	own := make([]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				if _, _, _, ok, err := s.Take(ctx, "shared"); err != nil {
					t.Error(err)
					return
				} else if ok {
					shared.Add(1)
				}
				if _, _, _, ok, _ := s.Take(ctx, fmt.Sprint("own", w)); ok {
					own[w]++
				}
				if i%100 == 0 {
					s.Get(ctx, "shared")
				}
			}
		})
	}
	wg.Wait()
	if got := shared.Load(); got != p.Tokens {
		t.Fatalf("shared key allowed %d of %d takes, want exactly %d", got, workers*perWorker, p.Tokens)
	}
	for w, n := range own {
		if n != min(perWorker, p.Tokens) {
			t.Fatalf("worker %d's own key allowed %d, want %d", w, n, perWorker)
		}
	}
}

// BenchmarkStoreTake compares this store with go-limiter's memorystore: one
// hot key shared by every goroutine, and one key per take out of 100,000.
func BenchmarkStoreTake(b *testing.B) {
	// A policy memorystore refills in full (tokens² ≤ interval in ns), so
	// both do the same work; refusals are counted as takes.
	p := Policy{Tokens: 1000, Interval: time.Millisecond}
	stores := []struct {
		name string
		make func() golimiter.Store
	}{
		{"memorystore", func() golimiter.Store {
			s, err := memorystore.New(&memorystore.Config{Tokens: p.Tokens, Interval: p.Interval})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"bucket", func() golimiter.Store {
			s, err := NewMemoryStore(p)
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = storeKey(SyncKey{Tenant: "t", Device: fmt.Sprint(i)})
	}
	for _, st := range stores {
		for _, shape := range []string{"one-key", "many-keys"} {
			b.Run(st.name+"/"+shape, func(b *testing.B) {
				s := st.make()
				defer s.Close(context.Background())
				ctx := context.Background()
				var next atomic.Uint64
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := next.Add(7919)
					for pb.Next() {
						k := keys[0]
						if shape == "many-keys" {
							i++
							k = keys[i%uint64(len(keys))]
						}
						if _, _, _, _, err := s.Take(ctx, k); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		}
	}
}
