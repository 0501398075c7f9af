package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"
)

// maxAnswerBytes bounds an answer body the generator reads (a batch answer of
// 100 results is about 20 KiB).
const maxAnswerBytes = 1 << 20

// conn is one producer's keep-alive HTTP/1.1 connection: the request written
// straight to the socket, the answer read with net/http's parser. The
// generator shares the machine with the server it measures, and net/http's
// Transport spends two goroutines and several channel hand-offs per request —
// about 50 µs of CPU per request at 64 producers on a 2 vCPU VM, twice what this costs
// (docs/benchmarks.md). A producer has one request in flight, so it needs
// nothing a Transport adds; pgbench drives PostgreSQL the same way.
type conn struct {
	addr string
	tls  *tls.Config // nil: plain http
	path string      // request target
	head []byte      // request line and fixed headers, up to "Content-Length: "

	c  net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func newConn(base *url.URL, route, token string) *conn {
	host := base.Host
	port := base.Port()
	if port == "" {
		port = "80"
		if base.Scheme == "https" {
			port = "443"
		}
	}
	c := &conn{addr: net.JoinHostPort(base.Hostname(), port), path: base.Path + route}
	if base.Scheme == "https" {
		c.tls = &tls.Config{ServerName: base.Hostname(), MinVersion: tls.VersionTLS12}
	}
	c.head = fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: envelopeworker-loadgen\r\n"+
		"Authorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: ", c.path, host, token)
	return c
}

// post sends body and returns the answer's status and body. Any error closes
// the connection; the next post dials again. ctx's deadline bounds the whole
// exchange and its cancellation aborts it.
func (c *conn) post(ctx context.Context, body []byte) (int, []byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	if c.c == nil {
		if err := c.dial(ctx); err != nil {
			return 0, nil, err
		}
	}
	status, b, err := c.exchange(ctx, body)
	if err != nil {
		c.close()
		if cerr := ctx.Err(); cerr != nil {
			err = fmt.Errorf("%w: %w", cerr, err)
		} else if _, has := ctx.Deadline(); has && errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket's deadline is ctx's; it can fire before ctx's own timer.
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		return 0, nil, fmt.Errorf("post %s: %w", c.path, err)
	}
	return status, b, nil
}

func (c *conn) dial(ctx context.Context) error {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", c.addr, err)
	}
	if c.tls != nil {
		tc := tls.Client(nc, c.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return fmt.Errorf("tls handshake with %s: %w", c.addr, err)
		}
		nc = tc
	}
	c.c, c.br, c.bw = nc, bufio.NewReaderSize(nc, 16<<10), bufio.NewWriterSize(nc, 16<<10)
	return nil
}

func (c *conn) exchange(ctx context.Context, body []byte) (int, []byte, error) {
	deadline, _ := ctx.Deadline() // none: the zero time, no deadline
	nc := c.c
	if err := nc.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	// A cancel before the deadline interrupts the blocked read or write. The func may still run
	// after exchange returned (stop does not wait for it) and close cleared c.c: it keeps its own
	// reference, and a deadline on a closed connection is harmless.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	_, _ = c.bw.Write(c.head)
	_, _ = c.bw.WriteString(strconv.Itoa(len(body)))
	_, _ = c.bw.WriteString("\r\n\r\n")
	_, _ = c.bw.Write(body)
	if err := c.bw.Flush(); err != nil {
		return 0, nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	_ = resp.Body.Close()
	if err != nil {
		return 0, nil, err
	}
	if len(b) > maxAnswerBytes {
		return 0, nil, errors.New("answer larger than 1 MiB")
	}
	if resp.Close {
		// The server said it closes the connection: start the next post on a new one.
		c.close()
	}
	return resp.StatusCode, b, nil
}

func (c *conn) close() {
	if c.c != nil {
		_ = c.c.Close()
		c.c, c.br, c.bw = nil, nil, nil
	}
}
