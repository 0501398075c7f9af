package limiter

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrInvalidProxies reports a trusted-proxy list that does not parse.
var ErrInvalidProxies = errors.New("limiter: invalid trusted proxies")

// TrustedProxies are the proxies whose X-Forwarded-For names the client
// (TRUSTED_PROXIES, contract §8.3). The zero value trusts nobody, so the
// client is always the TCP peer.
type TrustedProxies struct{ prefixes []netip.Prefix }

// ParseTrustedProxies reads a comma-separated list of CIDR prefixes
// ("10.0.0.0/8, 2001:db8::/32"). Blanks around entries and empty entries
// are ignored, so "" is the empty list. A bare address is refused (write
// 192.0.2.1/32), and so is an IPv4-mapped IPv6 prefix, which would never
// match: peers are compared in their IPv4 form.
func ParseTrustedProxies(list string) (TrustedProxies, error) {
	var t TrustedProxies
	for entry := range strings.SplitSeq(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		p, err := netip.ParsePrefix(entry)
		if err != nil {
			return TrustedProxies{}, fmt.Errorf("%w: %q is not a CIDR prefix such as 10.0.0.0/8 or 2001:db8::/32", ErrInvalidProxies, entry)
		}
		if p.Addr().Is4In6() {
			return TrustedProxies{}, fmt.Errorf("%w: %q is an IPv4-mapped IPv6 prefix; write it as IPv4 CIDR", ErrInvalidProxies, entry)
		}
		t.prefixes = append(t.prefixes, p.Masked())
	}
	return t, nil
}

// String is the list as ParseTrustedProxies reads it.
func (t TrustedProxies) String() string {
	s := make([]string, len(t.prefixes))
	for i, p := range t.prefixes {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// Empty reports whether no proxy is trusted.
func (t TrustedProxies) Empty() bool { return len(t.prefixes) == 0 }

// Trusts reports whether addr is inside a trusted prefix.
func (t TrustedProxies) Trusts(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range t.prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// ClientAddr is the address a request is counted under, given its TCP peer
// and its X-Forwarded-For header lines (in the order received).
//
// Only a trusted peer's header is read. Several header lines are one list,
// in order. The list is walked from the right, because each trusted proxy
// appends the address it received the request from: the first entry that
// is not itself a trusted proxy is the client. When every entry is trusted,
// the leftmost one is. An entry that is not a plain IP address (empty,
// "unknown", a port, a zone) stops the walk at the last hop known to be
// trusted, and that hop's address is the client: a malformed chain never
// yields a value a client could have written. From an untrusted peer the
// header is ignored. The answer is in IPv4 form for IPv4-mapped addresses.
func (t TrustedProxies) ClientAddr(peer netip.Addr, xff []string) netip.Addr {
	cur := peer.Unmap().WithZone("")
	if !t.Trusts(cur) {
		return cur
	}
	for i := len(xff) - 1; i >= 0; i-- {
		line := xff[i]
		for {
			j := strings.LastIndexByte(line, ',')
			a, err := netip.ParseAddr(strings.TrimSpace(line[j+1:]))
			if err != nil || a.Zone() != "" {
				return cur
			}
			a = a.Unmap()
			if !t.Trusts(a) {
				return a
			}
			cur = a
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	return cur
}
