package loadgen

import (
	"bufio"
	"bytes"
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
	"strings"
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
	path string      // request target of post
	base string      // the base URL's path, which a request target of do starts with
	head []byte      // fixed headers after the request line, up to "Content-Length: "

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
	c := &conn{addr: net.JoinHostPort(base.Hostname(), port), path: base.Path + route, base: base.Path}
	if base.Scheme == "https" {
		c.tls = &tls.Config{ServerName: base.Hostname(), MinVersion: tls.VersionTLS12}
	}
	c.head = fmt.Appendf(nil, "Host: %s\r\nUser-Agent: envelopeworker-loadgen\r\n"+
		"Authorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: ", host, token)
	return c
}

// post sends body and returns the answer's status and body. Any error closes
// the connection; the next post dials again. ctx's deadline bounds the whole
// exchange and its cancellation aborts it.
func (c *conn) post(ctx context.Context, body []byte) (int, []byte, error) {
	status, _, b, err := c.do(ctx, http.MethodPost, c.path, body)
	return status, b, err
}

// do is post for any method and request target (a path under the base URL's), and also returns the
// answer's headers.
func (c *conn) do(ctx context.Context, method, target string, body []byte) (int, http.Header, []byte, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, nil, err
	}
	if c.c == nil {
		if err := c.dial(ctx); err != nil {
			return 0, nil, nil, err
		}
	}
	status, h, b, err := c.exchange(ctx, method, target, body)
	if err != nil {
		c.close()
		if cerr := ctx.Err(); cerr != nil {
			err = fmt.Errorf("%w: %w", cerr, err)
		} else if _, has := ctx.Deadline(); has && errors.Is(err, os.ErrDeadlineExceeded) {
			// The socket's deadline is ctx's; it can fire before ctx's own timer.
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		return 0, nil, nil, fmt.Errorf("%s %s: %w", method, target, err)
	}
	return status, h, b, nil
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

func (c *conn) exchange(ctx context.Context, method, target string, body []byte) (int, http.Header, []byte, error) {
	deadline, _ := ctx.Deadline() // none: the zero time, no deadline
	nc := c.c
	if err := nc.SetDeadline(deadline); err != nil {
		return 0, nil, nil, err
	}
	// A cancel before the deadline interrupts the blocked read or write. The func may still run
	// after exchange returned (stop does not wait for it) and close cleared c.c: it keeps its own
	// reference, and a deadline on a closed connection is harmless.
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	_, _ = c.bw.WriteString(method)
	_, _ = c.bw.WriteString(" ")
	_, _ = c.bw.WriteString(target)
	_, _ = c.bw.WriteString(" HTTP/1.1\r\n")
	_, _ = c.bw.Write(c.head)
	_, _ = c.bw.WriteString(strconv.Itoa(len(body)))
	_, _ = c.bw.WriteString("\r\n\r\n")
	_, _ = c.bw.Write(body)
	if err := c.bw.Flush(); err != nil {
		return 0, nil, nil, err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, nil, nil, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	_ = resp.Body.Close()
	if err != nil {
		return 0, nil, nil, err
	}
	if len(b) > maxAnswerBytes {
		return 0, nil, nil, errors.New("answer larger than 1 MiB")
	}
	if resp.Close {
		// The server said it closes the connection: start the next post on a new one.
		c.close()
	}
	return resp.StatusCode, resp.Header, b, nil
}

func (c *conn) close() {
	if c.c != nil {
		_ = c.c.Close()
		c.c, c.br, c.bw = nil, nil, nil
	}
}

// connTransport is an http.RoundTripper over one conn, so that the producer module (which takes an
// *http.Client) sends a load generator's requests as cheaply as the raw runs: one producer, one request
// in flight, one connection. It sends the conn's own credential, the producer's; the request's headers
// are not copied.
type connTransport struct{ c *conn }

func (t connTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	target := req.URL.RequestURI()
	if !strings.HasPrefix(target, t.c.base) {
		return nil, fmt.Errorf("request %s is not under the base URL", req.URL.Path)
	}
	status, h, b, err := t.c.do(req.Context(), req.Method, target, body)
	if err != nil {
		return nil, err
	}
	return &http.Response{
		Status: strconv.Itoa(status) + " " + http.StatusText(status), StatusCode: status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		Body: io.NopCloser(bytes.NewReader(b)), ContentLength: int64(len(b)), Request: req,
	}, nil
}
