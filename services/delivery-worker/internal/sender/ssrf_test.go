package sender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// countingListener counts every TCP connection the kernel completed and the
// server accepted: a destination "contacted" at all, even without a request.
type countingListener struct {
	net.Listener
	accepts atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepts.Add(1)
	}
	return c, err
}

// trap is a TLS webhook endpoint on one loopback address whose listener
// counts accepted connections.
type trap struct {
	srv  *httptest.Server
	ln   *countingListener
	port string
}

func newTrap(t *testing.T, addr string) *trap {
	t.Helper()
	tr := tryTrap(t, addr)
	if tr == nil {
		t.Fatalf("cannot listen on %s", addr)
	}
	return tr
}

// tryTrap is newTrap, or nil where the address cannot be listened on (a
// machine without IPv6 loopback).
func tryTrap(t *testing.T, addr string) *trap {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Logf("cannot listen on %s: %v", addr, err)
		return nil
	}
	tr := &trap{ln: &countingListener{Listener: l}}
	tr.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	tr.srv.Listener.Close()
	tr.srv.Listener = tr.ln
	tr.srv.StartTLS()
	t.Cleanup(tr.srv.Close)
	_, tr.port, _ = net.SplitHostPort(l.Addr().String())
	return tr
}

// dnsServer is a resolver the test controls: answer decides the A and AAAA
// records for each question, and every question is counted.
type dnsServer struct {
	mu      sync.Mutex
	answer  func(name string, qtype dnsmessage.Type) []netip.Addr
	queries atomic.Int32
}

func (d *dnsServer) set(f func(name string, qtype dnsmessage.Type) []netip.Addr) {
	d.mu.Lock()
	d.answer = f
	d.mu.Unlock()
}

// answers returns a fixed answer: addrs split by family into A and AAAA.
func answers(addrs ...string) func(string, dnsmessage.Type) []netip.Addr {
	return func(_ string, qtype dnsmessage.Type) []netip.Addr {
		var out []netip.Addr
		for _, s := range addrs {
			a := netip.MustParseAddr(s)
			if (qtype == dnsmessage.TypeA) == a.Is4() {
				out = append(out, a)
			}
		}
		return out
	}
}

func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		client, server := net.Pipe()
		go d.serve(server)
		return client, nil
	}}
}

// serve answers TCP-framed queries on c (net.Pipe is a stream).
func (d *dnsServer) serve(c net.Conn) {
	defer c.Close()
	for {
		var l [2]byte
		if _, err := readFull(c, l[:]); err != nil {
			return
		}
		q := make([]byte, int(l[0])<<8|int(l[1]))
		if _, err := readFull(c, q); err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(q)
		if err != nil {
			return
		}
		question, err := p.Question()
		if err != nil {
			return
		}
		d.queries.Add(1)
		d.mu.Lock()
		answer := d.answer
		d.mu.Unlock()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
		_ = b.StartQuestions()
		_ = b.Question(question)
		_ = b.StartAnswers()
		rh := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 0}
		for _, a := range answer(strings.TrimSuffix(question.Name.String(), "."), question.Type) {
			if question.Type == dnsmessage.TypeA {
				_ = b.AResource(rh, dnsmessage.AResource{A: a.As4()})
			} else if question.Type == dnsmessage.TypeAAAA {
				_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.As16()})
			}
		}
		msg, err := b.Finish()
		if err != nil {
			return
		}
		if _, err := c.Write(append([]byte{byte(len(msg) >> 8), byte(len(msg))}, msg...)); err != nil {
			return
		}
	}
}

// TestSSRFNothingContacted: every endpoint URL, and every DNS answer, that
// points at loopback, RFC 1918, link-local (the metadata address), IPv6
// unique-local or an IPv4-mapped IPv6 form of those, is dead with
// blocked_address, and no connection reaches the listeners on 127.0.0.1 and
// ::1 that wait on the very ports the URLs name. A final allowed delivery to
// each listener proves they count: accepts are FIFO, so a count of exactly
// one afterwards means no blocked case left a connection behind.
func TestSSRFNothingContacted(t *testing.T) {
	v4 := newTrap(t, "127.0.0.1:0")
	v6 := tryTrap(t, "[::1]:0")
	pool := x509.NewCertPool()
	pool.AddCert(v4.srv.Certificate())
	if v6 == nil {
		// No IPv6 loopback: the v6 cases still run (they are refused before
		// any connection), aimed at the v4 listener's port.
		v6 = v4
	} else {
		pool.AddCert(v6.srv.Certificate())
	}
	tlsCfg := &tls.Config{RootCAs: pool}
	dns := &dnsServer{}
	dns.set(answers())
	strict := newSender(t, Config{Resolver: dns.resolver(), TLSConfig: tlsCfg, Timeout: 2 * time.Second})
	loose := newSender(t, Config{Resolver: dns.resolver(), TLSConfig: tlsCfg, Timeout: 2 * time.Second, AllowLoopback: true})

	p4, p6 := v4.port, v6.port
	literal := []struct {
		name string
		s    *Sender
		url  string
	}{
		{"loopback", strict, "https://127.0.0.1:" + p4 + "/"},
		{"loopback 127/8", strict, "https://127.0.0.2:" + p4 + "/"},
		{"loopback v6", strict, "https://[::1]:" + p6 + "/"},
		{"plain http loopback without flag", strict, "http://127.0.0.1:" + p4 + "/"},
		{"mapped loopback", strict, "https://[::ffff:127.0.0.1]:" + p4 + "/"},
		{"mapped loopback hex", strict, "https://[::ffff:7f00:1]:" + p4 + "/"},
		{"rfc1918 10/8", loose, "https://10.0.0.1:" + p4 + "/"},
		{"rfc1918 172.16/12", loose, "https://172.31.255.1:" + p4 + "/"},
		{"rfc1918 192.168/16", loose, "https://192.168.0.1:" + p4 + "/"},
		{"metadata", loose, "https://169.254.169.254/latest/meta-data/"},
		{"link-local v6", loose, "https://[fe80::1]:" + p6 + "/"},
		{"ula fc00::/7", loose, "https://[fd00::1]:" + p6 + "/"},
		{"ula fc00::1", loose, "https://[fc00::1]:" + p6 + "/"},
		{"mapped rfc1918", loose, "https://[::ffff:10.0.0.1]:" + p4 + "/"},
		{"mapped metadata", loose, "https://[::ffff:169.254.169.254]/"},
		{"mapped 192.168", loose, "https://[::ffff:192.168.1.1]:" + p4 + "/"},
		{"unspecified", loose, "https://0.0.0.0:" + p4 + "/"},
		{"unspecified v6", loose, "https://[::]:" + p6 + "/"},
	}
	for _, c := range literal {
		if r := send(t, c.s, c.url); r.Verdict != Dead || r.Code != CodeBlockedAddress {
			t.Errorf("literal %s (%s): %+v, want dead blocked_address", c.name, c.url, r)
		}
	}
	if n := dns.queries.Load(); n != 0 {
		t.Errorf("%d DNS queries for address literals", n)
	}

	// Names whose DNS answers are internal. The name is one the test
	// certificate is valid for, so only the address check stands between
	// the sender and the listener.
	named := []struct {
		name    string
		s       *Sender
		answers []string
		port    string
	}{
		{"A loopback", strict, []string{"127.0.0.1"}, p4},
		{"AAAA loopback", strict, []string{"::1"}, p6},
		{"A and AAAA loopback", strict, []string{"127.0.0.1", "::1"}, p4},
		{"AAAA mapped loopback", strict, []string{"::ffff:127.0.0.1"}, p4},
		{"A 10/8", loose, []string{"10.1.2.3"}, p4},
		{"A 172.16/12", loose, []string{"172.16.0.1"}, p4},
		{"A 192.168/16", loose, []string{"192.168.10.1"}, p4},
		{"A metadata", loose, []string{"169.254.169.254"}, p4},
		{"AAAA ula", loose, []string{"fd12:3456::1"}, p6},
		{"AAAA link-local", loose, []string{"fe80::1"}, p6},
		{"AAAA mapped rfc1918", loose, []string{"::ffff:10.0.0.1"}, p4},
		{"AAAA mapped metadata", loose, []string{"::ffff:169.254.169.254"}, p4},
		{"AAAA nat64 of loopback", strict, []string{"64:ff9b::7f00:1"}, p6},
		{"AAAA IPv4-translated rfc1918", loose, []string{"::ffff:0:a00:1"}, p6},
		{"AAAA IPv4-translated loopback", strict, []string{"::ffff:0:7f00:1"}, p6},
		{"AAAA local-use nat64 of metadata", loose, []string{"64:ff9b:1::a9fe:a9fe"}, p6},
		{"AAAA teredo", loose, []string{"2001:0:4136:e378:8000:63bf:f5ff:fffe"}, p6},
		{"every answer internal", loose, []string{"10.0.0.1", "192.168.0.1", "fd00::1", "169.254.169.254"}, p4},
	}
	for _, c := range named {
		dns.set(answers(c.answers...))
		before := dns.queries.Load()
		if r := send(t, c.s, "https://example.com:"+c.port+"/hook"); r.Verdict != Dead || r.Code != CodeBlockedAddress {
			t.Errorf("name answering %s (%v): %+v, want dead blocked_address", c.name, c.answers, r)
		}
		if dns.queries.Load() == before {
			t.Errorf("%s: the test's resolver was not asked", c.name)
		}
	}
	if a, b := v4.ln.accepts.Load(), v6.ln.accepts.Load(); a != 0 || b != 0 {
		t.Fatalf("blocked destinations contacted: %d connections on 127.0.0.1, %d on ::1", a, b)
	}

	// The listeners do count: an allowed delivery reaches each, once.
	dns.set(answers("127.0.0.1"))
	if r := send(t, loose, "https://example.com:"+p4+"/hook"); r.Verdict != Delivered {
		t.Fatalf("control delivery to 127.0.0.1: %+v", r)
	}
	if v6 != v4 {
		dns.set(answers("::1"))
		if r := send(t, loose, "https://example.com:"+p6+"/hook"); r.Verdict != Delivered {
			t.Fatalf("control delivery to ::1: %+v", r)
		}
	}
	if a, b := v4.ln.accepts.Load(), v6.ln.accepts.Load(); a != 1 || b != 1 {
		t.Fatalf("after one allowed delivery each: %d connections on 127.0.0.1, %d on ::1, want 1 and 1", a, b)
	}
	t.Logf("%d literal and %d DNS cases refused, 0 connections accepted", len(literal), len(named))
}

// TestDNSRebinding: a name that answers with a public address when it is
// validated and with an internal one when the sender connects is refused,
// because the check runs on the address being dialled, after the
// resolution the dial itself made. Were the sender to validate a first
// resolution and then dial the name, the second answer would reach the
// listener. Across attempts, a name that delivered to an allowed address and
// then rebinds to the metadata or a private address is refused on the next
// connection.
func TestDNSRebinding(t *testing.T) {
	v4 := newTrap(t, "127.0.0.1:0")
	pool := x509.NewCertPool()
	pool.AddCert(v4.srv.Certificate())
	tlsCfg := &tls.Config{RootCAs: pool}
	dns := &dnsServer{}
	url := "https://example.com:" + v4.port + "/hook"

	// Validation sees a public address; the connect sees loopback.
	dns.set(answers("93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"))
	strict := newSender(t, Config{Resolver: dns.resolver(), TLSConfig: tlsCfg, Timeout: 2 * time.Second})
	addrs, err := dns.resolver().LookupNetIP(context.Background(), "ip", "example.com")
	if err != nil || len(addrs) != 2 {
		t.Fatalf("validation lookup: %v %v", addrs, err)
	}
	for _, a := range addrs {
		if err := strict.policy.Check(a); err != nil {
			t.Fatalf("validation refuses %s: %v (the scenario needs a public first answer)", a, err)
		}
	}
	dns.set(answers("127.0.0.1"))
	before := dns.queries.Load()
	if r := send(t, strict, url); r.Verdict != Dead || r.Code != CodeBlockedAddress {
		t.Fatalf("rebound to loopback: %+v, want dead blocked_address", r)
	}
	if dns.queries.Load() == before {
		t.Fatal("the connect did not resolve the name again")
	}

	// Across attempts: allowed (loopback under the flag), then rebound.
	loose := newSender(t, Config{Resolver: dns.resolver(), TLSConfig: tlsCfg, Timeout: 2 * time.Second, AllowLoopback: true})
	if r := send(t, loose, url); r.Verdict != Delivered {
		t.Fatalf("first attempt to the allowed address: %+v", r)
	}
	for _, internal := range []string{"169.254.169.254", "10.0.0.1", "fd00::1", "::ffff:192.168.0.1"} {
		loose.Close() // no idle connection: the next attempt dials
		dns.set(answers(internal))
		if r := send(t, loose, url); r.Verdict != Dead || r.Code != CodeBlockedAddress {
			t.Errorf("rebound to %s: %+v, want dead blocked_address", internal, r)
		}
	}
	if n := v4.ln.accepts.Load(); n != 1 {
		t.Fatalf("%d connections accepted, want only the allowed attempt's", n)
	}
}

// TestProxyEnvironmentIgnored: a proxy named in the environment would make
// the proxy, not the checked address, the thing dialled (and let it reach
// whatever the name means to it). With HTTPS_PROXY and HTTP_PROXY pointing at
// a counting listener on loopback, which the flag allows, a name resolving to
// the metadata address is still refused and the proxy sees no connection.
func TestProxyEnvironmentIgnored(t *testing.T) {
	proxy := &countingListener{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxy.Listener = l
	defer proxy.Close()
	go func() {
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, k := range []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"} {
		t.Setenv(k, "http://"+l.Addr().String())
	}
	t.Setenv("NO_PROXY", "")
	dns := &dnsServer{}
	dns.set(answers("169.254.169.254"))
	s := newSender(t, Config{Resolver: dns.resolver(), Timeout: 2 * time.Second, AllowLoopback: true})
	if r := send(t, s, "https://example.com/latest/meta-data/"); r.Verdict != Dead || r.Code != CodeBlockedAddress {
		t.Fatalf("with a proxy in the environment: %+v, want dead blocked_address", r)
	}
	if n := proxy.accepts.Load(); n != 0 {
		t.Fatalf("the environment's proxy was contacted %d times", n)
	}
}
