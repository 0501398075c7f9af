package limiter

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParseTrustedProxies(t *testing.T) {
	good := map[string]string{
		"":                              "",
		" ":                             "",
		"127.0.0.1/32":                  "127.0.0.1/32",
		" 10.1.2.3/8 , 2001:db8::1/32,": "10.0.0.0/8,2001:db8::/32",
		"10.0.0.0/8,,192.168.0.0/16":    "10.0.0.0/8,192.168.0.0/16",
		"::1/128":                       "::1/128",
		"0.0.0.0/0":                     "0.0.0.0/0",
	}
	for in, want := range good {
		tp, err := ParseTrustedProxies(in)
		if err != nil || tp.String() != want {
			t.Errorf("ParseTrustedProxies(%q) = %q, %v; want %q", in, tp.String(), err, want)
		}
		if tp.Empty() != (want == "") {
			t.Errorf("ParseTrustedProxies(%q).Empty() = %v", in, tp.Empty())
		}
	}
	for _, in := range []string{"127.0.0.1", "10.0.0.0/33", "fe80::/64%eth0", "::ffff:10.0.0.0/104", "proxy.local/32", "10.0.0.0/8;10.1.0.0/16", "10.0.0.0/8 10.1.0.0/16"} {
		if _, err := ParseTrustedProxies(in); !errors.Is(err, ErrInvalidProxies) {
			t.Errorf("ParseTrustedProxies(%q) err = %v, want ErrInvalidProxies", in, err)
		}
	}
	_, err := ParseTrustedProxies("10.0.0.0/8, 127.0.0.1")
	if err == nil || err.Error() != `limiter: invalid trusted proxies: "127.0.0.1" is not a CIDR prefix such as 10.0.0.0/8 or 2001:db8::/32` {
		t.Errorf("message: %v", err)
	}
}

func TestClientAddr(t *testing.T) {
	proxies, err := ParseTrustedProxies("10.0.0.0/8, 2001:db8:ffff::/48, 127.0.0.1/32")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		tp   TrustedProxies
		peer string
		xff  []string
		want string
	}{
		{"no proxies configured: header ignored", TrustedProxies{}, "10.0.0.1", []string{"203.0.113.9"}, "10.0.0.1"},
		{"untrusted peer: spoofed header ignored", proxies, "198.51.100.7", []string{"203.0.113.9"}, "198.51.100.7"},
		{"untrusted peer claiming a trusted hop", proxies, "198.51.100.7", []string{"203.0.113.9, 10.0.0.5"}, "198.51.100.7"},
		{"trusted peer without header", proxies, "10.0.0.1", nil, "10.0.0.1"},
		{"trusted peer, one hop", proxies, "10.0.0.1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"client-forged entries left of the real one", proxies, "10.0.0.1", []string{"1.1.1.1, 2.2.2.2, 203.0.113.9"}, "203.0.113.9"},
		{"two trusted proxies", proxies, "10.0.0.1", []string{"203.0.113.9, 10.0.0.2"}, "203.0.113.9"},
		{"two trusted proxies, forged entry further left", proxies, "10.0.0.1", []string{"6.6.6.6, 203.0.113.9, 10.0.0.2"}, "203.0.113.9"},
		{"headers concatenate in order", proxies, "10.0.0.1", []string{"6.6.6.6", "203.0.113.9", "10.0.0.2"}, "203.0.113.9"},
		{"headers concatenate, last line has two", proxies, "10.0.0.1", []string{"6.6.6.6", "203.0.113.9, 10.0.0.2"}, "203.0.113.9"},
		{"IPv6 client through IPv6 proxy", proxies, "2001:db8:ffff::1", []string{"2001:db8:1:2::7"}, "2001:db8:1:2::7"},
		{"IPv4 client through IPv4-mapped trusted peer", proxies, "::ffff:10.0.0.1", []string{"203.0.113.9"}, "203.0.113.9"},
		{"IPv4-mapped entries are IPv4", proxies, "10.0.0.1", []string{"::ffff:203.0.113.9, ::ffff:10.0.0.2"}, "203.0.113.9"},
		{"every entry trusted: the leftmost", proxies, "10.0.0.1", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"garbage as the only entry: the trusted peer", proxies, "10.0.0.1", []string{"not-an-ip"}, "10.0.0.1"},
		{"garbage behind a trusted hop: that hop", proxies, "10.0.0.1", []string{"203.0.113.9, unknown, 10.0.0.2"}, "10.0.0.2"},
		{"garbage left of the client: not reached", proxies, "10.0.0.1", []string{"unknown, 203.0.113.9"}, "203.0.113.9"},
		{"empty entry: the trusted peer", proxies, "10.0.0.1", []string{"203.0.113.9,"}, "10.0.0.1"},
		{"empty header line: the trusted peer", proxies, "10.0.0.1", []string{""}, "10.0.0.1"},
		{"address with port is malformed", proxies, "10.0.0.1", []string{"203.0.113.9:4711"}, "10.0.0.1"},
		{"zoned address is malformed", proxies, "10.0.0.1", []string{"fe80::1%eth0"}, "10.0.0.1"},
		{"bracketed IPv6 is malformed", proxies, "10.0.0.1", []string{"[2001:db8::1]"}, "10.0.0.1"},
		{"blanks around entries", proxies, "127.0.0.1", []string{"  203.0.113.9 ,\t10.0.0.2 "}, "203.0.113.9"},
	}
	for _, c := range cases {
		got := c.tp.ClientAddr(netip.MustParseAddr(c.peer), c.xff)
		if got != netip.MustParseAddr(c.want) {
			t.Errorf("%s: ClientAddr(%s, %q) = %v, want %s", c.name, c.peer, c.xff, got, c.want)
		}
	}
	if got := proxies.ClientAddr(netip.Addr{}, []string{"203.0.113.9"}); got.IsValid() {
		t.Errorf("a peer without address (Unix socket) became %v", got)
	}
}
