package limiter

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
)

// MemoryStore is the default store: an in-process token bucket per key,
// refilled continuously at Tokens/Interval and holding at most Tokens. It
// implements go-limiter's Store.
//
// A bucket's level is kept as whole tokens plus a remainder in units of
// 1/Interval(ns) of a token, and elapsed time is turned into tokens with
// 128-bit integer arithmetic, so every policy the package accepts is exact:
// 1,000,000 an hour and 1 an hour alike, with no float drift and no rounding
// lost between calls (two half-intervals refill exactly one interval's
// tokens).
//
// Keys are spread over shards, each with its own mutex, so concurrent Takes
// of different keys rarely contend. A sweeper goroutine drops buckets that
// have refilled to capacity (they are indistinguishable from a new bucket)
// and shrinks shards that emptied, so memory follows the active keys; Close
// stops it.
type MemoryStore struct {
	tokens   uint64
	interval uint64 // nanoseconds
	clock    func() time.Time
	// base anchors the store's time: bucket times are nanoseconds since
	// base, read from the monotonic clock when clock is time.Now, so a wall
	// clock step neither refills nor freezes buckets.
	base time.Time
	seed maphash.Seed

	shards [shardCount]shard

	stopped atomic.Bool
	stop    chan struct{}
	swept   chan struct{} // closed when the sweeper has returned
}

// shardCount is a power of two well above the cores a replica has, so two
// busy keys rarely share a lock.
const shardCount = 64

type shard struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	// peak is the largest len(buckets) since the map was last rebuilt: Go
	// maps never shrink, so the sweeper rebuilds one that emptied out.
	peak int
	_    [40]byte // keeps neighbouring shards' locks off one cache line
}

// bucket is one key's state. All fields are guarded by its shard's mutex.
type bucket struct {
	capacity uint64 // tokens of the policy
	interval uint64 // nanoseconds of the policy
	level    uint64 // whole tokens available (above capacity only by Burst)
	rem      uint64 // fraction of the next token, in 1/interval units; < interval
	last     int64  // store time the level was computed at
	// burstUntil is when tokens above capacity (from Burst) lapse; 0: none.
	burstUntil int64
	// pinned buckets carry a policy from Set and are never swept, which
	// would silently return the key to the store's policy.
	pinned bool
}

// StoreOption configures a MemoryStore.
type StoreOption func(*storeOptions)

type storeOptions struct {
	clock func() time.Time
	sweep time.Duration
}

// WithStoreClock sets the store's clock (tests); the default is time.Now.
func WithStoreClock(now func() time.Time) StoreOption {
	return func(o *storeOptions) { o.clock = now }
}

// WithSweepInterval sets how often full buckets are dropped (default one
// minute). It bounds how long an idle key's memory lingers, not accuracy:
// a dropped bucket was full, exactly what a new one is.
func WithSweepInterval(d time.Duration) StoreOption {
	return func(o *storeOptions) { o.sweep = d }
}

// DefaultSweepInterval is the sweeper's period unless WithSweepInterval.
const DefaultSweepInterval = time.Minute

// NewMemoryStore builds a store enforcing p for every key not configured by
// Set. It starts the sweeper; Close stops it.
func NewMemoryStore(p Policy, opts ...StoreOption) (*MemoryStore, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	o := storeOptions{clock: time.Now, sweep: DefaultSweepInterval}
	for _, opt := range opts {
		opt(&o)
	}
	if o.sweep <= 0 {
		o.sweep = DefaultSweepInterval
	}
	s := &MemoryStore{
		tokens:   p.Tokens,
		interval: uint64(p.Interval),
		clock:    o.clock,
		base:     o.clock(),
		seed:     maphash.MakeSeed(),
		stop:     make(chan struct{}),
		swept:    make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].buckets = make(map[string]*bucket)
	}
	go s.sweeper(o.sweep)
	return s, nil
}

var _ golimiter.Store = (*MemoryStore)(nil)

// now is the store time: nanoseconds since base.
func (s *MemoryStore) now() int64 { return int64(s.clock().Sub(s.base)) }

// resetAt is the Unix nanoseconds go-limiter's reset carries: wait store
// nanoseconds after wall, the clock reading the store time was taken from.
// It starts from that reading, not from base, so a wall-clock step since the
// store started does not shift a Retry-After; it saturates rather than wraps
// for intervals of centuries.
func resetAt(wall time.Time, wait int64) uint64 {
	w := wall.UnixNano()
	if wait > math.MaxInt64-w {
		return math.MaxInt64
	}
	return uint64(w + wait)
}

func (s *MemoryStore) shardOf(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&(shardCount-1)]
}

func (s *MemoryStore) newBucket(tokens, interval uint64, now int64) *bucket {
	return &bucket{capacity: tokens, interval: interval, level: tokens, last: now}
}

// current is key's bucket brought up to now; a key without one gets a full
// bucket of the store's policy. sh.mu must be held.
func (s *MemoryStore) current(sh *shard, key string, now int64) *bucket {
	b, found := sh.buckets[key]
	if !found {
		b = s.newBucket(s.tokens, s.interval, now)
		s.put(sh, key, b)
		return b
	}
	b.refill(now)
	return b
}

// put stores b as key's bucket. sh.mu must be held.
func (s *MemoryStore) put(sh *shard, key string, b *bucket) {
	sh.buckets[key] = b
	sh.peak = max(sh.peak, len(sh.buckets))
}

// refill brings b up to now. Time that runs backwards (a test clock) adds
// nothing and keeps b.last, so the same span is never counted twice.
func (b *bucket) refill(now int64) {
	if now <= b.last {
		return
	}
	if b.burstUntil != 0 && now >= b.burstUntil {
		b.burstUntil = 0
		b.level = min(b.level, b.capacity)
	}
	elapsed := uint64(now - b.last)
	b.last = now
	if b.level >= b.capacity {
		b.rem = 0
		return
	}
	if elapsed >= b.interval {
		b.level, b.rem = b.capacity, 0
		return
	}
	// elapsed·capacity tokens-per-interval, in 1/interval units of a token:
	// elapsed < interval, so the high word is below interval and Div64
	// cannot overflow; rem+r < 2·interval ≤ 2^64.
	hi, lo := bits.Mul64(elapsed, b.capacity)
	q, r := bits.Div64(hi, lo, b.interval)
	b.rem += r
	if b.rem >= b.interval {
		b.rem -= b.interval
		q++
	}
	if q >= b.capacity-b.level {
		b.level, b.rem = b.capacity, 0
		return
	}
	b.level += q
}

// nextToken is the store time the bucket next gains a whole token: now if
// it is full (nothing is pending), else once the remainder reaches a whole
// token, rounded up to the nanosecond.
func (b *bucket) nextToken(now int64) int64 {
	// A Take that read the clock before another one locked the shard sees
	// b.last ahead of its now; the remainder is as of b.last.
	now = max(now, b.last)
	if b.level >= b.capacity {
		return now
	}
	need := b.interval - b.rem // > 0: rem < interval
	wait := (need + b.capacity - 1) / b.capacity
	if wait > uint64(math.MaxInt64-now) {
		return math.MaxInt64
	}
	return now + int64(wait)
}

// full reports whether b, brought up to now, is a bucket a new key would
// get; it does not change b.
func (b *bucket) full(now int64) bool {
	c := *b
	c.refill(now)
	return c.level == c.capacity && c.burstUntil == 0
}

// Take spends one token of key. reset is when the bucket next gains a token
// (Unix nanoseconds): on a refusal, the earliest time a retry can succeed.
func (s *MemoryStore) Take(_ context.Context, key string) (tokens, remaining, reset uint64, ok bool, err error) {
	if s.stopped.Load() {
		return 0, 0, 0, false, golimiter.ErrStopped
	}
	wall := s.clock()
	now := int64(wall.Sub(s.base))
	sh := s.shardOf(key)
	sh.mu.Lock()
	b := s.current(sh, key, now)
	if b.level > 0 {
		b.level--
		ok = true
	}
	tokens, remaining, next := b.capacity, b.level, b.nextToken(now)
	sh.mu.Unlock()
	return tokens, remaining, resetAt(wall, next-now), ok, nil
}

// Get returns the key's policy tokens and the tokens it has now, without
// spending or storing anything. A key without a bucket has a full one.
func (s *MemoryStore) Get(_ context.Context, key string) (tokens, remaining uint64, err error) {
	if s.stopped.Load() {
		return 0, 0, golimiter.ErrStopped
	}
	now := s.now()
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b, found := sh.buckets[key]
	if !found {
		return s.tokens, s.tokens, nil
	}
	c := *b
	c.refill(now)
	return c.capacity, c.level, nil
}

// Set gives key its own policy and a full bucket of it, replacing any
// bucket it had. The key keeps that policy until Close: its bucket is never
// swept.
func (s *MemoryStore) Set(_ context.Context, key string, tokens uint64, interval time.Duration) error {
	if s.stopped.Load() {
		return golimiter.ErrStopped
	}
	if err := (Policy{Tokens: tokens, Interval: interval}).Validate(); err != nil {
		return err
	}
	now := s.now()
	b := s.newBucket(tokens, uint64(interval), now)
	b.pinned = true
	sh := s.shardOf(key)
	sh.mu.Lock()
	s.put(sh, key, b)
	sh.mu.Unlock()
	return nil
}

// Burst adds tokens to key's bucket beyond its capacity; what is not spent
// within one interval of the policy lapses, as go-limiter's "until the next
// interval tick". A key without a bucket gets a full one plus the burst.
func (s *MemoryStore) Burst(_ context.Context, key string, tokens uint64) error {
	if s.stopped.Load() {
		return golimiter.ErrStopped
	}
	now := s.now()
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	b := s.current(sh, key, now)
	if tokens == 0 {
		return nil
	}
	b.level += min(tokens, ^uint64(0)-b.level)
	if b.level >= b.capacity {
		b.rem = 0 // a full bucket accrues nothing
	}
	b.burstUntil = now + int64(min(b.interval, uint64(1<<62)))
	return nil
}

// Close stops the sweeper and drops every bucket; later calls answer
// go-limiter's ErrStopped. It is safe to call more than once.
func (s *MemoryStore) Close(ctx context.Context) error {
	if !s.stopped.CompareAndSwap(false, true) {
		return nil
	}
	close(s.stop)
	select {
	case <-s.swept:
	case <-ctx.Done():
		return ctx.Err()
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.buckets, sh.peak = map[string]*bucket{}, 0
		sh.mu.Unlock()
	}
	return nil
}

// Len is the number of buckets held (swept keys are not counted).
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

func (s *MemoryStore) sweeper(every time.Duration) {
	defer close(s.swept)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep drops full buckets, one shard at a time so Takes of other shards
// go on, and rebuilds a shard's map once it holds under a quarter of its
// peak, which is how the memory of a burst of keys is given back.
func (s *MemoryStore) sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		for k, b := range sh.buckets {
			if !b.pinned && b.full(now) {
				delete(sh.buckets, k)
			}
		}
		if n := len(sh.buckets); n < sh.peak/4 {
			m := make(map[string]*bucket, n)
			for k, b := range sh.buckets {
				m[k] = b
			}
			sh.buckets, sh.peak = m, n
		}
		sh.mu.Unlock()
	}
}
