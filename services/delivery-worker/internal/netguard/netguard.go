// Package netguard owns the delivery worker's rule for which network
// addresses a webhook may reach. The check runs on the address the dialer is
// about to connect to (net.Dialer.ControlContext), after DNS resolution, so a
// hostname that resolves, or re-resolves, to an internal address is refused
// at connect time: checking the URL's host alone would be defeated by DNS
// rebinding.
//
// Refused: loopback, private (RFC 1918, IPv6 ULA fc00::/7), link-local
// unicast and multicast (including 169.254.169.254, the cloud metadata
// address), multicast, unspecified, and the other special-purpose ranges
// listed in blockedPrefixes (shared CGNAT space, "this network", benchmarking,
// reserved, broadcast), in their IPv4 form or any IPv6 form that embeds them
// (IPv4-mapped ::ffff:a.b.c.d, IPv4-translated ::ffff:0:a.b.c.d,
// IPv4-compatible, NAT64 64:ff9b::/96, 6to4 2002::/16). The translation and
// tunnelling prefixes whose embedded address cannot be judged (local-use
// NAT64 64:ff9b:1::/48, Teredo 2001::/32) are refused whole.
//
// AllowLoopback (DELIVERY_ALLOW_INSECURE_LOOPBACK) lets loopback through, and
// nothing else; plain HTTP is allowed only to a loopback address, and only
// then. A connection made for a plain-HTTP request is marked on its context
// (WithPlainHTTP) so the dialer can hold it to loopback even when the host
// name is one the resolver could answer with something else.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// ErrBlocked reports a refused destination. It never carries the address in
// its text beyond what the caller wraps around it.
var ErrBlocked = errors.New("netguard: destination address refused")

// blockedPrefixes are the special-purpose ranges that netip's predicates do
// not cover on their own.
var blockedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),  // shared address space (CGNAT)
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, includes broadcast
	netip.MustParsePrefix("::/128"),         // unspecified
	netip.MustParsePrefix("100::/64"),       // discard-only
	netip.MustParsePrefix("2001:db8::/32"),  // documentation
	netip.MustParsePrefix("fec0::/10"),      // deprecated site-local
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use IPv4/IPv6 translation (RFC 8215)
	netip.MustParsePrefix("2001::/32"),      // Teredo: reaches an IPv4 address through a relay
}

var (
	nat64Prefix  = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour    = netip.MustParsePrefix("2002::/16")
	v4Compat     = netip.MustParsePrefix("::/96")
	v4Translated = netip.MustParsePrefix("::ffff:0:0:0/96") // IPv4-translated (SIIT, RFC 2765)
)

// Policy decides which addresses may be dialled.
type Policy struct {
	// AllowLoopback lets loopback addresses through (local runs and tests).
	AllowLoopback bool
}

// Check returns nil when addr may be dialled, else an error wrapping
// ErrBlocked.
func (p Policy) Check(addr netip.Addr) error {
	addr = addr.WithZone("")
	if !addr.IsValid() {
		return fmt.Errorf("%w: not an IP address", ErrBlocked)
	}
	for _, a := range forms(addr) {
		if a.IsLoopback() {
			if p.AllowLoopback {
				continue
			}
			return fmt.Errorf("%w: loopback", ErrBlocked)
		}
		if reason := special(a); reason != "" {
			return fmt.Errorf("%w: %s", ErrBlocked, reason)
		}
	}
	return nil
}

// IsLoopback reports whether addr, or the IPv4 address it embeds, is
// loopback.
func IsLoopback(addr netip.Addr) bool {
	for _, a := range forms(addr.WithZone("")) {
		if a.IsLoopback() {
			return true
		}
	}
	return false
}

// forms is addr and every IPv4 address an IPv6 form of it embeds, so each is
// judged on its own.
func forms(addr netip.Addr) []netip.Addr {
	out := []netip.Addr{addr}
	if !addr.Is6() {
		return out
	}
	if addr.Is4In6() {
		return append(out, addr.Unmap())
	}
	b := addr.As16()
	switch {
	case nat64Prefix.Contains(addr), v4Translated.Contains(addr),
		v4Compat.Contains(addr) && addr != netip.IPv6Unspecified() && addr != netip.IPv6Loopback():
		out = append(out, netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
	case sixToFour.Contains(addr):
		out = append(out, netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
	}
	return out
}

func special(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast(), a.IsMulticast():
		return "multicast"
	}
	for _, p := range blockedPrefixes {
		if p.Contains(a) {
			return "special-purpose"
		}
	}
	return ""
}

type plainHTTPKey struct{}

// WithPlainHTTP marks ctx as dialling for a plain-HTTP request: the dialer
// then accepts only loopback (and only under AllowLoopback).
func WithPlainHTTP(ctx context.Context) context.Context {
	return context.WithValue(ctx, plainHTTPKey{}, true)
}

func isPlainHTTP(ctx context.Context) bool {
	v, _ := ctx.Value(plainHTTPKey{}).(bool)
	return v
}

// Control is a net.Dialer.ControlContext hook enforcing p on the address
// being connected to.
func (p Policy) Control(ctx context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: unparsable dial address", ErrBlocked)
	}
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fmt.Errorf("%w: network %s", ErrBlocked, network)
	}
	if err := p.Check(ap.Addr()); err != nil {
		return err
	}
	if isPlainHTTP(ctx) && !(p.AllowLoopback && IsLoopback(ap.Addr())) {
		return fmt.Errorf("%w: plain http to a non-loopback address", ErrBlocked)
	}
	return nil
}

// Dialer returns a dialer that enforces p. resolver may be nil (system
// resolver); tests pass one that answers with chosen addresses.
func (p Policy) Dialer(timeout time.Duration, resolver *net.Resolver) *net.Dialer {
	return &net.Dialer{
		Timeout:        timeout,
		KeepAlive:      30 * time.Second,
		Resolver:       resolver,
		ControlContext: p.Control,
	}
}
