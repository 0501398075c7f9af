// Package httpservetest checks that a running listener cuts slow clients,
// for the tests of every binary that serves HTTP.
package httpservetest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Limit is how long a check waits for the server to close a connection:
// far above the short timeouts a test configures and far below
// httpserve.DefaultTimeouts, so only the configured timeouts explain a pass.
const Limit = 5 * time.Second

// CutsSlowClients fails t unless the listener at addr closes, within Limit,
// a connection whose request headers never end (slow loris) and an idle
// keep-alive connection after a 200 answer to GET path.
func CutsSlowClients(t testing.TB, addr, path string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
		t.Fatal(err)
	}
	closedWithin(t, addr+" slow headers", conn)

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", addr, path, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Close {
		t.Fatalf("%s %s: status %d, close %v; want a kept-alive 200", addr, path, res.StatusCode, res.Close)
	}
	closedWithin(t, addr+" idle keep-alive", idle)
}

func closedWithin(t testing.TB, what string, conn net.Conn) {
	t.Helper()
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(Limit))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: connection still open after %v", what, Limit)
	}
	t.Logf("%s: closed after %v", what, time.Since(start).Round(time.Millisecond))
}
