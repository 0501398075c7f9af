package limiter

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newSync(t *testing.T, p Policy) *Sync {
	t.Helper()
	l, err := New[SyncKey](p)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func TestExactTokenCounts(t *testing.T) {
	ctx := context.Background()
	l := newSync(t, Policy{Tokens: 3, Interval: time.Hour})
	k := SyncKey{Tenant: "t", Account: "a", Device: "d", Purpose: PurposeSyncIngest}
	for i, wantRemaining := range []uint64{2, 1, 0} {
		d, err := l.Take(ctx, k)
		if err != nil {
			t.Fatalf("take %d: %v", i, err)
		}
		if !d.Allowed || d.Limit != 3 || d.Remaining != wantRemaining {
			t.Fatalf("take %d = %+v, want allowed, limit 3, remaining %d", i, d, wantRemaining)
		}
	}
	for i := range 3 {
		d, err := l.Take(ctx, k)
		if err != nil {
			t.Fatalf("extra take %d: %v", i, err)
		}
		if d.Allowed || d.Remaining != 0 {
			t.Fatalf("extra take %d = %+v, want refused with 0 remaining", i, d)
		}
	}
}

func TestResetAndRetryAfter(t *testing.T) {
	ctx := context.Background()
	l := newSync(t, Policy{Tokens: 1, Interval: time.Hour})
	k := SyncKey{Tenant: "t", Account: "a", Device: "d", Purpose: PurposeSyncIngest}
	before := time.Now()
	if d, err := l.Take(ctx, k); err != nil || !d.Allowed {
		t.Fatalf("first take = %+v, %v", d, err)
	}
	d, err := l.Take(ctx, k)
	after := time.Now()
	if err != nil || d.Allowed {
		t.Fatalf("second take = %+v, %v; want refusal", d, err)
	}
	// The bucket was created between before and after, so it resets one
	// interval later.
	if d.Reset.Before(before) || d.Reset.After(after.Add(time.Hour)) {
		t.Fatalf("reset %v outside [%v, %v]", d.Reset, before, after.Add(time.Hour))
	}
	if d.RetryAfter%time.Second != 0 {
		t.Fatalf("RetryAfter %v is not whole seconds", d.RetryAfter)
	}
	if d.RetryAfter < d.Reset.Sub(after) || d.RetryAfter > time.Hour+time.Second {
		t.Fatalf("RetryAfter %v does not cover reset in %v", d.RetryAfter, d.Reset.Sub(after))
	}
	if got := d.RetryAfterSeconds(); got < 3598 || got > 3600 {
		t.Fatalf("RetryAfterSeconds = %d, want about 3600", got)
	}
}

func TestRetryAfterRounding(t *testing.T) {
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	cases := []struct {
		in   time.Duration
		want time.Duration
	}{
		{-time.Hour, time.Second},
		{0, time.Second},
		{time.Nanosecond, time.Second},
		{999 * time.Millisecond, time.Second},
		{time.Second, time.Second},
		{time.Second + time.Nanosecond, 2 * time.Second},
		{1500 * time.Millisecond, 2 * time.Second},
		{2 * time.Second, 2 * time.Second},
		{59*time.Second + 1, time.Minute},
		{time.Hour, time.Hour},
	}
	for _, c := range cases {
		if got := RetryAfter(now.Add(c.in), now); got != c.want {
			t.Errorf("RetryAfter(now+%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestRetryAfterUsesClock(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	l, err := New[DeliveryKey](Policy{Tokens: 1, Interval: time.Hour}, WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	d, err := l.Take(ctx, DeliveryKey{Tenant: "t"})
	if err != nil || !d.Allowed {
		t.Fatalf("take = %+v, %v", d, err)
	}
	if want := clock.Now().Add(time.Hour); !d.Reset.Equal(want) {
		t.Fatalf("Reset %v, want %v (the next token)", d.Reset, want)
	}
	clock.Advance(time.Hour - 1500*time.Millisecond)
	d, err = l.Take(ctx, DeliveryKey{Tenant: "t"})
	if err != nil || d.Allowed {
		t.Fatalf("second take = %+v, %v; want refusal", d, err)
	}
	if d.RetryAfter != 2*time.Second {
		t.Fatalf("RetryAfter = %v, want 2s (1.5s rounded up)", d.RetryAfter)
	}
}

func TestSyncKeySeparation(t *testing.T) {
	ctx := context.Background()
	l := newSync(t, Policy{Tokens: 1, Interval: time.Hour})
	base := SyncKey{Tenant: "t1", Account: "a1", Device: "d1", Purpose: PurposeSyncIngest}
	if d, err := l.Take(ctx, base); err != nil || !d.Allowed {
		t.Fatalf("base take = %+v, %v", d, err)
	}
	if d, err := l.Take(ctx, base); err != nil || d.Allowed {
		t.Fatalf("base second take = %+v, %v; want refusal", d, err)
	}
	others := []SyncKey{
		{Tenant: "t2", Account: "a1", Device: "d1", Purpose: PurposeSyncIngest},
		{Tenant: "t1", Account: "a2", Device: "d1", Purpose: PurposeSyncIngest},
		{Tenant: "t1", Account: "a1", Device: "d2", Purpose: PurposeSyncIngest},
		{Tenant: "t1", Account: "a1", Device: "d1", Purpose: "other"},
		// Concatenation would make these equal to base or to each other.
		{Tenant: "t1a1", Account: "", Device: "d1", Purpose: PurposeSyncIngest},
		{Tenant: "t", Account: "1a1", Device: "d1", Purpose: PurposeSyncIngest},
		{Tenant: "t1", Account: "a1d1", Device: "", Purpose: PurposeSyncIngest},
	}
	for _, k := range others {
		d, err := l.Take(ctx, k)
		if err != nil || !d.Allowed {
			t.Errorf("key %+v shares a bucket: %+v, %v", k, d, err)
		}
	}
}

func TestEncodingsAreDistinct(t *testing.T) {
	addr4 := netip.MustParseAddr("192.0.2.1")
	encs := map[string]string{}
	add := func(name string, b []byte) {
		t.Helper()
		if prev, ok := encs[string(b)]; ok {
			t.Fatalf("%s encodes like %s: %q", name, prev, b)
		}
		encs[string(b)] = name
	}
	add("peer4", NewPeerKey(addr4).appendEncoding(nil))
	add("peer6", NewPeerKey(netip.MustParseAddr("2001:db8::1")).appendEncoding(nil))
	add("peer-invalid", NewPeerKey(netip.Addr{}).appendEncoding(nil))
	add("sync ab|c", SyncKey{Tenant: "ab", Account: "c"}.appendEncoding(nil))
	add("sync a|bc", SyncKey{Tenant: "a", Account: "bc"}.appendEncoding(nil))
	add("sync empty", SyncKey{}.appendEncoding(nil))
	add("delivery empty", DeliveryKey{}.appendEncoding(nil))
	add("delivery t", DeliveryKey{Tenant: "t"}.appendEncoding(nil))
	add("sync t", SyncKey{Tenant: "t"}.appendEncoding(nil))
	if len(storeKey(SyncKey{Tenant: "t"})) != 32 {
		t.Fatal("store keys are not fixed-size digests")
	}
}

func TestPeerKeyIsAddressOnly(t *testing.T) {
	ctx := context.Background()
	l, err := New[PeerKey](Policy{Tokens: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	// Same host on two ports, and as an IPv4-mapped IPv6 address.
	a := netip.MustParseAddrPort("192.0.2.7:1111").Addr()
	b := netip.MustParseAddrPort("192.0.2.7:2222").Addr()
	mapped := netip.MustParseAddr("::ffff:192.0.2.7")
	if NewPeerKey(mapped) != NewPeerKey(a) {
		t.Fatal("IPv4-mapped address keyed apart from its IPv4 form")
	}
	if d, err := l.Take(ctx, NewPeerKey(a)); err != nil || !d.Allowed {
		t.Fatalf("first = %+v, %v", d, err)
	}
	for _, addr := range []netip.Addr{b, mapped} {
		if d, err := l.Take(ctx, NewPeerKey(addr)); err != nil || d.Allowed {
			t.Fatalf("%v = %+v, %v; want refusal (same host)", addr, d, err)
		}
	}
	other := netip.MustParseAddr("192.0.2.8")
	if d, err := l.Take(ctx, NewPeerKey(other)); err != nil || !d.Allowed {
		t.Fatalf("other host = %+v, %v; want allowed", d, err)
	}
	zoned := netip.MustParseAddr("fe80::1%eth0")
	if NewPeerKey(zoned) != NewPeerKey(netip.MustParseAddr("fe80::1")) {
		t.Fatal("zone splits a peer into two keys")
	}
}

func TestPoliciesDoNotShareBuckets(t *testing.T) {
	ctx := context.Background()
	p := Policy{Tokens: 1, Interval: time.Hour}
	s1 := newSync(t, p)
	s2 := newSync(t, p)
	k := SyncKey{Tenant: "t"}
	if d, _ := s1.Take(ctx, k); !d.Allowed {
		t.Fatal("s1 first take refused")
	}
	if d, _ := s2.Take(ctx, k); !d.Allowed {
		t.Fatal("a second limiter shares the first one's bucket")
	}
}

func TestInvalidPolicy(t *testing.T) {
	for _, p := range []Policy{
		{}, {Tokens: 0, Interval: time.Second}, {Tokens: 1}, {Tokens: 1, Interval: -time.Second},
		{Tokens: MaxTokens + 1, Interval: time.Hour}, {Tokens: math.MaxUint64, Interval: time.Hour},
		{Tokens: 1, Interval: time.Millisecond - 1}, {Tokens: 1, Interval: time.Nanosecond},
	} {
		if _, err := New[SyncKey](p); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("New(%+v) err = %v, want ErrInvalidPolicy", p, err)
		}
	}
}

func TestTakeAfterClose(t *testing.T) {
	ctx := context.Background()
	l, err := New[SyncKey](Policy{Tokens: 5, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	d, err := l.Take(ctx, SyncKey{Tenant: "t"})
	if !errors.Is(err, ErrClosed) || d.Allowed {
		t.Fatalf("Take after Close = %+v, %v; want refusal and ErrClosed", d, err)
	}
}

func BenchmarkTakeParallel(b *testing.B) {
	ctx := context.Background()
	// Far more tokens than the benchmark spends: every take is allowed.
	l, err := New[SyncKey](Policy{Tokens: MaxTokens, Interval: time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		k := SyncKey{Tenant: "tenant-a", Account: "acct", Device: "device-7", Purpose: PurposeSyncIngest}
		for pb.Next() {
			if _, err := l.Take(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestEveryPolicyInTheContractRangeIsAccepted(t *testing.T) {
	for _, p := range []Policy{
		{Tokens: 1, Interval: time.Millisecond},
		{Tokens: 31623, Interval: time.Second},
		{Tokens: 100_000, Interval: time.Second},
		{Tokens: MaxTokens, Interval: time.Millisecond},
		{Tokens: MaxTokens, Interval: time.Second},
		{Tokens: MaxTokens, Interval: time.Hour},
		{Tokens: 1, Interval: time.Duration(math.MaxInt64)},
	} {
		l, err := New[PeerKey](p)
		if err != nil {
			t.Fatalf("%+v: %v", p, err)
		}
		if d, err := l.Take(context.Background(), NewPeerKey(netip.MustParseAddr("192.0.2.1"))); err != nil || !d.Allowed || d.Remaining != p.Tokens-1 {
			t.Errorf("%+v: first take = %+v, %v", p, d, err)
		}
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPeerKeyIPv6By64IPv4ByAddress(t *testing.T) {
	same := func(a, b string) {
		t.Helper()
		if NewPeerKey(netip.MustParseAddr(a)) != NewPeerKey(netip.MustParseAddr(b)) {
			t.Errorf("%s and %s keyed apart, want one bucket", a, b)
		}
	}
	apart := func(a, b string) {
		t.Helper()
		if NewPeerKey(netip.MustParseAddr(a)) == NewPeerKey(netip.MustParseAddr(b)) {
			t.Errorf("%s and %s share a key, want two buckets", a, b)
		}
	}
	same("2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff")
	same("2001:db8:1:2:aaaa::", "2001:db8:1:2::")
	same("fe80::1%eth0", "fe80::2")
	apart("2001:db8:1:2::1", "2001:db8:1:3::1")
	apart("2001:db8:1:2::1", "2001:db9:1:2::1")
	// IPv4 by address, the mapped form as IPv4, never by /64 of ::ffff:0:0/96.
	same("::ffff:192.0.2.7", "192.0.2.7")
	apart("192.0.2.7", "192.0.2.8")
	apart("::ffff:192.0.2.7", "::ffff:192.0.2.8")
	// An IPv4 host and the IPv6 /64 that would hold its bits are not one key.
	apart("0.0.0.0", "::")
	if got := NewPeerKey(netip.MustParseAddr("2001:db8:1:2:3:4:5:6")).Addr(); got != netip.MustParseAddr("2001:db8:1:2::") {
		t.Errorf("Addr() = %v, want the /64's first address", got)
	}

	ctx := context.Background()
	l, err := New[PeerKey](Policy{Tokens: 1, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(ctx)
	take := func(a string) bool {
		d, err := l.Take(ctx, NewPeerKey(netip.MustParseAddr(a)))
		if err != nil {
			t.Fatal(err)
		}
		return d.Allowed
	}
	if !take("2001:db8:0:1::1") || take("2001:db8:0:1::beef") || !take("2001:db8:0:2::1") {
		t.Fatal("a /64 is not one bucket, or two /64s share one")
	}
}

func TestInvalidPolicyMessage(t *testing.T) {
	_, err := New[SyncKey](Policy{Tokens: 1_000_001, Interval: time.Second})
	if err == nil || err.Error() != "limiter: invalid policy: tokens must be between 1 and 1000000, not 1000001" {
		t.Fatalf("err = %v", err)
	}
	_, err = New[SyncKey](Policy{Tokens: 1, Interval: 500 * time.Microsecond})
	if err == nil || err.Error() != "limiter: invalid policy: interval must be at least 1ms, not 500µs" {
		t.Fatalf("err = %v", err)
	}
}
