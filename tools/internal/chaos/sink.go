package chaos

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/envelopeworker/envelopeworker/tools/internal/webhooksink"
)

// SinkMode is how the sink misbehaves while a fault window is open.
type SinkMode int

// The sink's fault modes. In a window, each request misbehaves with probability 1/2 (flap takes the
// whole endpoint away), so deliveries keep making progress through the fault.
const (
	SinkHealthy SinkMode = iota
	SinkStall            // hold the request until the worker gives up (or 10s)
	SinkReset            // close the connection with RST before answering
	SinkSlow             // answer 204 after 0.3–2.5s (often after the worker's timeout)
	Sink500              // answer 500
	Sink429              // answer 429 with Retry-After: 1
	SinkFlap             // the listener goes away (connections closed), then comes back on the same port
)

var sinkModeNames = map[SinkMode]string{
	SinkHealthy: "healthy", SinkStall: "stall", SinkReset: "reset", SinkSlow: "slow", Sink500: "500",
	Sink429: "429_retry_after", SinkFlap: "flap",
}

func (m SinkMode) String() string { return sinkModeNames[m] }

// Receipt is one request the sink took in: the message id (webhook-id), when it arrived and when the
// answer was finished, and what the answer was ("204", "500", "429", "reset", "stall", or "refused:<n>"
// when the verifying sink refused the signature or the body).
type Receipt struct {
	MessageID string
	Arrived   time.Time
	Finished  time.Time
	Answer    string
}

// OK reports whether the sink answered 2xx.
func (r Receipt) OK() bool { return r.Answer == "204" || r.Answer == "200" }

// Sink is a webhook receiver with fault modes. Healthy requests go to the verifying
// webhooksink.Sink (Standard Webhooks signature, timestamp, canonical envelope).
type Sink struct {
	addr   string
	verify *webhooksink.Sink

	mu       sync.Mutex
	mode     SinkMode
	srv      *http.Server
	served   chan struct{}
	receipts map[string][]Receipt
	rnd      *rand.Rand
	closed   bool
	quit     chan struct{} // closed by Close: held requests end
	handlers sync.WaitGroup
}

// NewSink starts a sink on a loopback port; secret is the HMAC key of the endpoint.
func NewSink(secret []byte) (*Sink, error) {
	v, err := webhooksink.New(webhooksink.Config{Secrets: [][]byte{secret}})
	if err != nil {
		return nil, fmt.Errorf("verifying sink: %w", err)
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, fmt.Errorf("sink address: %w", err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("sink listen: %w", err)
	}
	s := &Sink{addr: l.Addr().String(), verify: v, receipts: map[string][]Receipt{},
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), quit: make(chan struct{})}
	s.serve(l)
	return s, nil
}

// URL is the base URL deliveries go to.
func (s *Sink) URL() string { return "http://" + s.addr }

func (s *Sink) serve(l net.Listener) {
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	s.srv, s.served = srv, served
	go func() {
		defer close(served)
		_ = srv.Serve(l)
	}()
}

// SetMode opens (or, with SinkHealthy, closes) a fault window.
func (s *Sink) SetMode(m SinkMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode = m
}

// Flap takes the endpoint away for down (every connection is closed), then listens again on the
// same port. It returns when the sink is back, or with ctx's error (the sink is back then too).
func (s *Sink) Flap(ctx context.Context, down time.Duration) error {
	s.mu.Lock()
	srv, served := s.srv, s.served
	s.mu.Unlock()
	_ = srv.Close()
	<-served
	select {
	case <-ctx.Done():
	case <-time.After(down):
	}
	var l net.Listener
	var err error
	for range 50 {
		if l, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("sink relisten on %s: %w", s.addr, err)
	}
	s.mu.Lock()
	s.serve(l)
	s.mu.Unlock()
	return ctx.Err()
}

// Close stops the sink and every connection, and waits for the requests it was holding.
func (s *Sink) Close() {
	s.mu.Lock()
	srv, served := s.srv, s.served
	s.closed = true
	s.mu.Unlock()
	_ = srv.Close()
	<-served
	close(s.quit)
	s.handlers.Wait()
}

// Receipts returns a copy of every receipt so far, by message id, in arrival order.
func (s *Sink) Receipts() map[string][]Receipt {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string][]Receipt, len(s.receipts))
	for id, rs := range s.receipts {
		out[id] = append([]Receipt(nil), rs...)
	}
	return out
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (s *Sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := Receipt{MessageID: r.Header.Get("webhook-id"), Arrived: time.Now()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.handlers.Add(1)
	defer s.handlers.Done()
	mode := s.mode
	if mode != SinkHealthy && s.rnd.IntN(2) == 0 {
		mode = SinkHealthy
	}
	slow := time.Duration(300+s.rnd.IntN(2200)) * time.Millisecond
	s.mu.Unlock()

	switch mode {
	case SinkStall:
		// Read the body first: only then does the request's context end when the worker hangs up.
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, webhooksink.MaxBody))
		select {
		case <-r.Context().Done():
		case <-s.quit:
		case <-time.After(10 * time.Second):
		}
		rc.Answer = "stall"
	case SinkReset:
		rc.Answer = "reset"
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				_ = conn.Close()
				break
			}
		}
		panic(http.ErrAbortHandler)
	case Sink500:
		w.WriteHeader(http.StatusInternalServerError)
		rc.Answer = "500"
	case Sink429:
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		rc.Answer = "429"
	default:
		if mode == SinkSlow {
			select {
			case <-r.Context().Done():
				rc.Answer = "aborted" // the worker gave up first: it never saw an answer
			case <-s.quit:
				rc.Answer = "aborted"
			case <-time.After(slow):
			}
			if rc.Answer != "" {
				break
			}
		}
		rec := &statusRecorder{ResponseWriter: w}
		s.verify.ServeHTTP(rec, r)
		rc.Answer = fmt.Sprint(rec.status)
		if rec.status == 0 {
			rc.Answer = "200"
		} else if rec.status >= 300 {
			rc.Answer = fmt.Sprintf("refused:%d", rec.status)
		}
	}
	rc.Finished = time.Now()
	s.mu.Lock()
	s.receipts[rc.MessageID] = append(s.receipts[rc.MessageID], rc)
	s.mu.Unlock()
}
