package httpserve_test

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/httpserve"
	"github.com/envelopeworker/envelopeworker/modules/httpserve/httpservetest"
)

func TestDefaultsAreBounded(t *testing.T) {
	d := httpserve.DefaultTimeouts
	for name, v := range map[string]time.Duration{"read header": d.ReadHeader, "read": d.Read, "write": d.Write, "idle": d.Idle} {
		if v <= 0 || v > 2*time.Minute {
			t.Errorf("default %s timeout %v", name, v)
		}
	}
	s := d.Server(http.NotFoundHandler(), nil)
	if s.ReadHeaderTimeout != d.ReadHeader || s.ReadTimeout != d.Read || s.WriteTimeout != d.Write || s.IdleTimeout != d.Idle ||
		s.MaxHeaderBytes != httpserve.MaxHeaderBytes {
		t.Fatalf("server %+v does not carry %+v", s, d)
	}
}

func TestServerCutsSlowClients(t *testing.T) {
	short := httpserve.Timeouts{ReadHeader: 300 * time.Millisecond, Read: time.Second, Write: time.Second, Idle: 300 * time.Millisecond}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := short.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok")) }), nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	httpservetest.CutsSlowClients(t, ln.Addr().String(), "/")
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != http.ErrServerClosed {
		t.Fatalf("serve: %v", err)
	}
}
