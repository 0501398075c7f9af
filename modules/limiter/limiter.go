package limiter

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
)

// PurposeSyncIngest is the SyncKey purpose of inbound envelope posts.
const PurposeSyncIngest = "sync-ingest"

// ErrInvalidPolicy reports a policy that cannot be enforced.
var ErrInvalidPolicy = errors.New("limiter: invalid policy")

// ErrClosed is returned by Take after Close.
var ErrClosed = errors.New("limiter: closed")

// Policy is one rate: Tokens takes per Interval.
type Policy struct {
	Tokens   uint64
	Interval time.Duration
}

// Validate refuses a policy go-limiter would silently replace by its own
// defaults (zero tokens or interval become 1 per second there).
func (p Policy) Validate() error {
	if p.Tokens == 0 {
		return fmt.Errorf("%w: tokens must be at least 1", ErrInvalidPolicy)
	}
	if p.Interval <= 0 {
		return fmt.Errorf("%w: interval must be positive", ErrInvalidPolicy)
	}
	return nil
}

// Key is a typed limiter key. It is implemented only by PeerKey, SyncKey and
// DeliveryKey: the encoding is this package's business.
type Key interface {
	comparable
	appendEncoding(dst []byte) []byte
}

// PeerKey identifies a remote peer by IP address. Build it with NewPeerKey.
type PeerKey struct{ addr netip.Addr }

// NewPeerKey keys by address only: an IPv4-mapped IPv6 address counts as its
// IPv4 form and a zone is dropped, so one host cannot look like two. An
// invalid address (e.g. a Unix-socket peer) gets one shared bucket.
func NewPeerKey(addr netip.Addr) PeerKey {
	return PeerKey{addr: addr.Unmap().WithZone("")}
}

// Addr returns the normalised address.
func (k PeerKey) Addr() netip.Addr { return k.addr }

func (k PeerKey) appendEncoding(dst []byte) []byte {
	dst = append(dst, "peer\x00"...)
	if !k.addr.IsValid() {
		return appendField(dst, "")
	}
	b := k.addr.AsSlice()
	return appendField(dst, string(b))
}

// SyncKey identifies a verified device for one purpose.
type SyncKey struct {
	Tenant, Account, Device, Purpose string
}

func (k SyncKey) appendEncoding(dst []byte) []byte {
	dst = append(dst, "sync\x00"...)
	dst = appendField(dst, k.Tenant)
	dst = appendField(dst, k.Account)
	dst = appendField(dst, k.Device)
	return appendField(dst, k.Purpose)
}

// DeliveryKey identifies a tenant's delivery scheduler. Tenant must come from
// trusted data (the outbox row), never from a request.
type DeliveryKey struct {
	Tenant string
}

func (k DeliveryKey) appendEncoding(dst []byte) []byte {
	dst = append(dst, "delivery\x00"...)
	return appendField(dst, k.Tenant)
}

// appendField length-prefixes s so no two field sequences share an encoding.
func appendField(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// storeKey is the string handed to the go-limiter store.
func storeKey[K Key](k K) string {
	var buf [128]byte
	sum := sha256.Sum256(k.appendEncoding(buf[:0]))
	return string(sum[:])
}

// Decision is the result of one Take.
type Decision struct {
	Allowed   bool
	Limit     uint64
	Remaining uint64
	// Reset is when the bucket refills.
	Reset time.Time
	// RetryAfter is whole seconds until Reset, at least one second. It is set
	// on refusals and successes alike; callers send it only on refusals.
	RetryAfter time.Duration
}

// RetryAfterSeconds is RetryAfter as the integer a Retry-After header carries.
func (d Decision) RetryAfterSeconds() int64 {
	return int64(d.RetryAfter / time.Second)
}

// RetryAfter rounds the time from now to reset up to whole seconds, with a
// floor of one second: a reset already passed (clock skew, a slow caller)
// still tells the client to wait rather than to retry at once.
func RetryAfter(reset, now time.Time) time.Duration {
	d := reset.Sub(now)
	if d <= time.Second {
		return time.Second
	}
	secs := (d + time.Second - 1) / time.Second
	return secs * time.Second
}

// Option configures a Limiter.
type Option func(*options)

type options struct {
	store golimiter.Store
	now   func() time.Time
}

// WithStore replaces the default memorystore. The store must already be
// configured with the policy's tokens and interval; the Limiter closes it.
func WithStore(s golimiter.Store) Option {
	return func(o *options) { o.store = s }
}

// WithClock sets the clock used to turn the reset time into RetryAfter. It
// must agree with the store's clock (the memorystore reads the wall clock).
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// Limiter enforces one Policy over keys of type K.
type Limiter[K Key] struct {
	policy Policy
	store  golimiter.Store
	now    func() time.Time

	closeOnce sync.Once
	closeErr  error
}

// New builds a limiter for p, on an in-memory store unless WithStore is given.
func New[K Key](p Policy, opts ...Option) (*Limiter[K], error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.store == nil {
		// go-limiter's memorystore refills interval/tokens tokens per elapsed
		// interval (capped at tokens), so a policy with tokens² above the
		// interval in nanoseconds silently refills less than configured (1e8
		// per second lets about 10 a second through). Refuse it rather than
		// enforce a rate nobody asked for.
		if float64(p.Tokens)*float64(p.Tokens) > float64(p.Interval.Nanoseconds()) {
			return nil, fmt.Errorf("%w: %d tokens per %s is more than the in-memory store can refill (at most √(interval in ns) tokens: %d per %s)",
				ErrInvalidPolicy, p.Tokens, p.Interval, uint64(math.Sqrt(float64(p.Interval.Nanoseconds()))), p.Interval)
		}
		s, err := memorystore.New(&memorystore.Config{
			Tokens:   p.Tokens,
			Interval: p.Interval,
			// Buckets idle for a few intervals are full again anyway; sweeping
			// them bounds memory under many short-lived peers.
			SweepInterval: max(p.Interval*4, time.Minute),
			SweepMinTTL:   max(p.Interval*2, time.Minute),
		})
		if err != nil {
			return nil, fmt.Errorf("limiter: memorystore: %w", err)
		}
		o.store = s
	}
	return &Limiter[K]{policy: p, store: o.store, now: o.now}, nil
}

// Policy returns the configured policy.
func (l *Limiter[K]) Policy() Policy { return l.policy }

// Take spends one token of k. A store error (including ErrClosed) is returned
// with a refusing Decision: callers must fail closed.
func (l *Limiter[K]) Take(ctx context.Context, k K) (Decision, error) {
	limit, remaining, reset, ok, err := l.store.Take(ctx, storeKey(k))
	if err != nil {
		if errors.Is(err, golimiter.ErrStopped) {
			err = ErrClosed
		}
		return Decision{}, fmt.Errorf("limiter: take: %w", err)
	}
	now := l.now()
	resetAt := time.Unix(0, int64(reset))
	return Decision{
		Allowed:    ok,
		Limit:      limit,
		Remaining:  remaining,
		Reset:      resetAt,
		RetryAfter: RetryAfter(resetAt, now),
	}, nil
}

// Close releases the store (and stops the memorystore's sweeper goroutine).
func (l *Limiter[K]) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		if err := l.store.Close(ctx); err != nil {
			l.closeErr = fmt.Errorf("limiter: close: %w", err)
		}
	})
	return l.closeErr
}

// Peer, Sync and Delivery name the three policies' limiter types.
type (
	Peer     = Limiter[PeerKey]
	Sync     = Limiter[SyncKey]
	Delivery = Limiter[DeliveryKey]
)
