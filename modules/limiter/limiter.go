package limiter

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	golimiter "github.com/sethvargo/go-limiter"
)

// SyncKey purposes: one bucket per verified device and purpose.
const (
	// PurposeSyncIngest is the purpose of inbound envelope posts.
	PurposeSyncIngest = "sync-ingest"
	// PurposeOutboxEnqueue is the purpose of outbox message requests
	// (contract §8.4).
	PurposeOutboxEnqueue = "outbox-enqueue"
)

// ErrInvalidPolicy reports a policy that cannot be enforced.
var ErrInvalidPolicy = errors.New("limiter: invalid policy")

// ErrClosed is returned by Take after Close.
var ErrClosed = errors.New("limiter: closed")

// Policy is one rate: Tokens takes per Interval, as a token bucket of
// Tokens refilled continuously at Tokens/Interval.
type Policy struct {
	Tokens   uint64
	Interval time.Duration
}

// The range of policies enforced exactly (contract §8.3). Nothing inside it
// is refused.
const (
	MinTokens   = 1
	MaxTokens   = 1_000_000
	MinInterval = time.Millisecond
)

// Validate refuses a policy outside the contract's range, rather than
// enforce one nobody configured (go-limiter would turn zero into 1 per
// second).
func (p Policy) Validate() error {
	if p.Tokens < MinTokens || p.Tokens > MaxTokens {
		return fmt.Errorf("%w: tokens must be between %d and %d, not %d", ErrInvalidPolicy, MinTokens, MaxTokens, p.Tokens)
	}
	if p.Interval < MinInterval {
		return fmt.Errorf("%w: interval must be at least %s, not %s", ErrInvalidPolicy, MinInterval, p.Interval)
	}
	return nil
}

// Key is a typed limiter key. It is implemented only by PeerKey, SyncKey and
// DeliveryKey: the encoding is this package's business.
type Key interface {
	comparable
	appendEncoding(dst []byte) []byte
}

// PeerKey identifies a remote peer: an IPv4 host, or an IPv6 /64. Build it
// with NewPeerKey.
type PeerKey struct{ addr netip.Addr }

// NewPeerKey keys IPv4 clients by address and IPv6 clients by their /64
// (contract §8.3): one IPv6 subscriber is usually given a whole /64, so
// keying by full address would hand it 2^64 buckets. An IPv4-mapped IPv6
// address counts as its IPv4 form and a zone is dropped, so one host cannot
// look like two. An invalid address (e.g. a Unix-socket peer) gets one
// shared bucket.
func NewPeerKey(addr netip.Addr) PeerKey {
	addr = addr.Unmap().WithZone("")
	if addr.Is6() {
		p, _ := addr.Prefix(64) // cannot fail for a 128-bit address
		addr = p.Addr()
	}
	return PeerKey{addr: addr}
}

// Addr returns the keyed address: the IPv4 address, or the first address
// of the IPv6 /64.
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
	// Reset is when the bucket next gains a token (now, if it is full): on a
	// refusal, the earliest time a retry can succeed.
	Reset time.Time
	// RetryAfter is whole seconds until Reset, rounded up, at least one
	// second. It is set on refusals and successes alike; callers send it
	// only on refusals.
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

// WithStore replaces the default MemoryStore (e.g. by a store shared
// between replicas). The store must already be configured with the
// policy's tokens and interval; the Limiter closes it.
func WithStore(s golimiter.Store) Option {
	return func(o *options) { o.store = s }
}

// WithClock sets the clock of the default store and the one used to turn
// its reset time into RetryAfter (tests). With WithStore it must agree with
// that store's clock.
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

// New builds a limiter for p, on a MemoryStore unless WithStore is given.
func New[K Key](p Policy, opts ...Option) (*Limiter[K], error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	o := options{now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.store == nil {
		s, err := NewMemoryStore(p, WithStoreClock(o.now))
		if err != nil {
			return nil, err
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

// Close releases the store (and stops the MemoryStore's sweeper goroutine).
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
