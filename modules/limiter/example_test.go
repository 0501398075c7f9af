package limiter_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
)

// A sync limiter of 2 envelopes a second per device: the third take within
// the second is refused with the Retry-After a 429 carries, and another
// device has its own bucket.
func Example() {
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	lim, err := limiter.New[limiter.SyncKey](limiter.Policy{Tokens: 2, Interval: time.Second},
		limiter.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	defer lim.Close(context.Background())

	dev := limiter.SyncKey{Tenant: "t1", Account: "a1", Device: "d1", Purpose: limiter.PurposeSyncIngest}
	for range 3 {
		d, err := lim.Take(context.Background(), dev)
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfterSeconds(), err)
	}
	other := dev
	other.Device = "d2"
	d, _ := lim.Take(context.Background(), other)
	fmt.Println("other device:", d.Allowed)

	now = now.Add(500 * time.Millisecond) // half the interval refills one token
	d, _ = lim.Take(context.Background(), dev)
	fmt.Println("after 500ms:", d.Allowed)
	// Output:
	// true 1 1 <nil>
	// true 0 1 <nil>
	// false 0 1 <nil>
	// other device: true
	// after 500ms: true
}

// The peer limiter's client address: behind a trusted proxy, the rightmost
// X-Forwarded-For entry that is not itself a trusted proxy; from anyone
// else the header is ignored. IPv6 clients share their /64's bucket.
func ExampleTrustedProxies_ClientAddr() {
	proxies, err := limiter.ParseTrustedProxies("10.0.0.0/8")
	if err != nil {
		panic(err)
	}
	xff := []string{"203.0.113.9, 198.51.100.7, 10.1.2.3"}
	fmt.Println(proxies.ClientAddr(netip.MustParseAddr("10.0.0.1"), xff))
	fmt.Println(proxies.ClientAddr(netip.MustParseAddr("192.0.2.1"), xff))
	fmt.Println(limiter.NewPeerKey(netip.MustParseAddr("2001:db8:1:2:3:4:5:6")).Addr())
	// Output:
	// 198.51.100.7
	// 192.0.2.1
	// 2001:db8:1:2::
}
