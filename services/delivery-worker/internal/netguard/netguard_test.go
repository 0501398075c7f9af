package netguard

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		addr          string
		blocked       bool // with loopback refused
		blockedWithLB bool // with AllowLoopback
	}{
		{"93.184.216.34", false, false},
		{"2606:2800:220:1:248:1893:25c8:1946", false, false},
		{"127.0.0.1", true, false},
		{"127.8.9.10", true, false},
		{"::1", true, false},
		{"::ffff:127.0.0.1", true, false},
		{"10.0.0.1", true, true},
		{"10.255.255.255", true, true},
		{"172.16.5.4", true, true},
		{"192.168.1.1", true, true},
		{"169.254.169.254", true, true},
		{"::ffff:169.254.169.254", true, true},
		{"::ffff:10.1.2.3", true, true},
		{"fe80::1", true, true},
		{"fc00::1", true, true},
		{"fd12:3456::1", true, true},
		{"224.0.0.1", true, true},
		{"ff02::1", true, true},
		{"0.0.0.0", true, true},
		{"::", true, true},
		{"100.64.0.1", true, true},
		{"255.255.255.255", true, true},
		{"64:ff9b::a00:1", true, true},       // NAT64 of 10.0.0.1
		{"64:ff9b::7f00:1", true, false},     // NAT64 of 127.0.0.1
		{"2002:a9fe:a9fe::1", true, true},    // 6to4 of 169.254.169.254
		{"64:ff9b::5db8:d822", false, false}, // NAT64 of a public address
		// IPv4-translated (SIIT) forms embed an address as NAT64 does.
		{"::ffff:0:7f00:1", true, false},     // of 127.0.0.1
		{"::ffff:0:a00:1", true, true},       // of 10.0.0.1
		{"::ffff:0:a9fe:a9fe", true, true},   // of 169.254.169.254
		{"::ffff:0:5db8:d822", false, false}, // of a public address
		// Translation and tunnelling prefixes whose target cannot be judged.
		{"64:ff9b:1::a00:1", true, true},                     // local-use NAT64
		{"2001:0:4136:e378:8000:63bf:f5ff:fffe", true, true}, // Teredo
	}
	for _, c := range cases {
		a := netip.MustParseAddr(c.addr)
		err := Policy{}.Check(a)
		if (err != nil) != c.blocked {
			t.Errorf("Check(%s) without loopback = %v, want blocked=%v", c.addr, err, c.blocked)
		}
		if err != nil && !errors.Is(err, ErrBlocked) {
			t.Errorf("Check(%s) error %v does not wrap ErrBlocked", c.addr, err)
		}
		err = Policy{AllowLoopback: true}.Check(a)
		if (err != nil) != c.blockedWithLB {
			t.Errorf("Check(%s) with loopback = %v, want blocked=%v", c.addr, err, c.blockedWithLB)
		}
	}
	if err := (Policy{}).Check(netip.Addr{}); !errors.Is(err, ErrBlocked) {
		t.Errorf("invalid address: %v, want ErrBlocked", err)
	}
}

func TestControl(t *testing.T) {
	ctx := context.Background()
	plain := WithPlainHTTP(ctx)
	cases := []struct {
		name    string
		p       Policy
		ctx     context.Context
		network string
		addr    string
		ok      bool
	}{
		{"public https", Policy{}, ctx, "tcp", "93.184.216.34:443", true},
		{"public v6", Policy{}, ctx, "tcp6", "[2606:2800:220:1:248:1893:25c8:1946]:443", true},
		{"loopback refused", Policy{}, ctx, "tcp4", "127.0.0.1:443", false},
		{"loopback allowed", Policy{AllowLoopback: true}, ctx, "tcp4", "127.0.0.1:443", true},
		{"metadata", Policy{AllowLoopback: true}, ctx, "tcp4", "169.254.169.254:80", false},
		{"plain http to loopback", Policy{AllowLoopback: true}, plain, "tcp", "127.0.0.1:8080", true},
		{"plain http to public", Policy{AllowLoopback: true}, plain, "tcp", "93.184.216.34:80", false},
		{"plain http without flag", Policy{}, plain, "tcp", "127.0.0.1:8080", false},
		{"udp", Policy{}, ctx, "udp", "93.184.216.34:53", false},
		{"hostname", Policy{}, ctx, "tcp", "example.com:443", false},
		{"zone", Policy{}, ctx, "tcp6", "[fe80::1%eth0]:443", false},
	}
	for _, c := range cases {
		err := c.p.Control(c.ctx, c.network, c.addr, nil)
		if (err == nil) != c.ok {
			t.Errorf("%s: Control = %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBlocked) {
			t.Errorf("%s: %v does not wrap ErrBlocked", c.name, err)
		}
	}
}
