package chaos

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// freeAddr returns a loopback address nothing listens on right now, outside the kernel's
// ephemeral port range. Replicas, the sink and PostgreSQL are restarted on the addresses they
// were given; a port from the ephemeral range can be taken meanwhile as the local end of any
// outgoing connection (a client's, a replica's own to PostgreSQL), and the restart then fails
// with "address already in use". Ports below the range are never handed out that way.
func freeAddr() (string, error) {
	low, high := ephemeralRange()
	// Ports from 10000 up to the range's start, or above its end when the range starts low.
	lo, hi := 10000, low-1
	if hi-lo < 1000 {
		lo, hi = high+1, 65535
	}
	if hi-lo < 100 {
		return "", fmt.Errorf("free address: no ports outside the ephemeral range %d-%d", low, high)
	}
	var err error
	for range 200 {
		port := lo + rand.IntN(hi-lo+1)
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			addr := l.Addr().String()
			_ = l.Close()
			return addr, nil
		}
	}
	return "", fmt.Errorf("free address: %w", err)
}

// ephemeralRange is the kernel's range for automatically bound ports (Linux's default when it
// cannot be read).
func ephemeralRange() (int, int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			lo, err1 := strconv.Atoi(f[0])
			hi, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil && lo <= hi {
				return lo, hi
			}
		}
	}
	return 32768, 60999
}

func freePort() (int, error) {
	addr, err := freeAddr()
	if err != nil {
		return 0, err
	}
	_, p, _ := net.SplitHostPort(addr)
	return strconv.Atoi(p)
}
