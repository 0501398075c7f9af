package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo/buildtest"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// killSink answers every request 204 except the first, which it holds until
// the client goes away (the worker process dies mid-request).
type killSink struct {
	srv   *httptest.Server
	first chan struct{} // closed when the first request arrives
	mu    sync.Mutex
	seen  []sinkHit
}

type sinkHit struct {
	id   string
	body []byte
	at   time.Time
}

func newKillSink(t *testing.T) *killSink {
	s := &killSink{first: make(chan struct{})}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.seen = append(s.seen, sinkHit{id: r.Header.Get("webhook-id"), body: body, at: time.Now()})
		n := len(s.seen)
		s.mu.Unlock()
		if n == 1 {
			close(s.first)
			<-r.Context().Done() // the killed worker's connection closing ends this
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *killSink) hits() []sinkHit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sinkHit(nil), s.seen...)
}

// buildWorker compiles this command (once per scripts/test.sh run, see buildtest).
func buildWorker(t *testing.T) string {
	t.Helper()
	return buildtest.Binary(t, "services/delivery-worker", t.TempDir())
}

// proc is a running worker process; exited is closed once it has exited.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // valid after exited
	logs   *bytes.Buffer
}

// startWorker runs the binary; it is SIGKILLed at cleanup if still running.
func startWorker(t *testing.T, bin string, env []string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin), exited: make(chan struct{}), logs: &bytes.Buffer{}}
	p.cmd.Env = env
	p.cmd.Stdout = p.logs
	p.cmd.Stderr = p.logs
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start worker: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	return p
}

// kill SIGKILLs the process if it still runs and waits for it, after which
// its logs may be read.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// waitFor polls cond until it holds or within runs out.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		<-tick.C
	}
}

// A worker process killed with SIGKILL while its HTTP request is in flight
// settles nothing; the message stays leased until the lease expires, then a
// second process claims it as attempt 2 (counting one lease expiry) and
// delivers the byte-identical body under the same webhook-id.
func TestSIGKILLMidRequestIsRedeliveredAfterLease(t *testing.T) {
	const lease = 2 * time.Second
	dsn := storetest.NewDatabase(t)
	st := storetest.Open(t, dsn)
	ctx := context.Background()
	sink := newKillSink(t)
	if _, err := st.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "orders",
		URL: sink.srv.URL + "/hook", SecretRef: "ep"}); err != nil {
		t.Fatalf("AddEndpoint: %v", err)
	}
	key := "kill-test-key"
	res, err := st.Outbox().Enqueue(ctx, store.Actor{TenantID: "t1", DeviceID: "svc1", CorrelationID: "c-kill"},
		store.EnqueueRequest{
			ProjectID: "p1", ProducerID: "svc1", Topic: "orders",
			IdempotencyDigest: sha256.Sum256([]byte(key)), RequestDigest: sha256.Sum256([]byte("body " + key)),
			MaxAttempts: 5,
			Build: func(seq int64) ([]byte, string, error) {
				ident := sha256.Sum256([]byte("t1\np1\n" + key))
				return fmt.Appendf(nil, `{"event_id":%q,"sequence":%d}`, key, seq), hex.EncodeToString(ident[:]), nil
			},
		})
	if err != nil || len(res.MessageIDs) != 1 {
		t.Fatalf("Enqueue: %v (%d messages)", err, len(res.MessageIDs))
	}
	id := res.MessageIDs[0]

	secretsFile := filepath.Join(t.TempDir(), "secrets.json")
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("kill-test-secret-24bytes"))
	if err := os.WriteFile(secretsFile, []byte(`{"ep":["`+secret+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"DATABASE_URL=" + storetest.DSNForRole(dsn, "envelopeworker_delivery"),
		"METRICS_ADDR=127.0.0.1:0",
		"WEBHOOK_SECRETS_FILE=" + secretsFile,
		"DELIVERY_LEASE=" + lease.String(),
		"DELIVERY_HTTP_TIMEOUT=1s", // under 4/5 of the lease
		"DELIVERY_ALLOW_INSECURE_LOOPBACK=true",
		"DELIVERY_POLL_INTERVAL=50ms",
		"SHUTDOWN_GRACE=5s",
		"LOG_LEVEL=warn",
		"PATH=" + os.Getenv("PATH"),
	}
	bin := buildWorker(t)

	first := startWorker(t, bin, env)
	select {
	case <-sink.first:
	case <-first.exited:
		t.Fatalf("first worker exited before attempting: %v\n%s", first.err, first.logs)
	case <-time.After(30 * time.Second):
		first.kill()
		t.Fatalf("first worker made no request within 30s\n%s", first.logs)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL: %v", err)
	}
	<-first.exited
	if ws, ok := first.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("first worker ended with %v; want killed by SIGKILL", first.err)
	}

	admin := storetest.AdminDB(t, dsn)
	var status string
	var attempts int
	var leaseEnd time.Time
	if err := admin.QueryRow(`SELECT status, attempts, lease_expires_at FROM outbox_messages WHERE message_id = $1`, id).
		Scan(&status, &attempts, &leaseEnd); err != nil {
		t.Fatalf("read message: %v", err)
	}
	if status != "delivering" || attempts != 1 {
		t.Fatalf("after the kill: status %q attempts %d, want delivering 1", status, attempts)
	}

	second := startWorker(t, bin, env)
	waitFor(t, 30*time.Second, "the second worker to deliver", func() bool {
		s, err := st.Outbox().OutboxMessage(ctx, "t1", id)
		return err == nil && s.Status == "delivered"
	})

	m, err := st.Outbox().OutboxMessage(ctx, "t1", id)
	if err != nil {
		t.Fatalf("OutboxMessage: %v", err)
	}
	if m.Status != "delivered" || m.Attempts != 2 || m.LastErrorCode != "" || m.DeliveredAt == nil {
		t.Fatalf("message %+v, want delivered on attempt 2", m)
	}
	var expiries int
	if err := admin.QueryRow(`SELECT lease_expiries FROM outbox_messages WHERE message_id = $1`, id).Scan(&expiries); err != nil {
		t.Fatalf("read lease_expiries: %v", err)
	}
	if expiries != 1 {
		t.Fatalf("lease_expiries %d, want 1", expiries)
	}
	// The history (contract §8.8), written by the delivery role: the killed
	// attempt as lease_expired, lasting the lease, then the delivery.
	as, err := st.Outbox().OutboxAttempts(ctx, "t1", id)
	if err != nil || len(as) != 2 {
		t.Fatalf("attempts %+v, %v", as, err)
	}
	if a := as[0]; a.Attempt != 1 || a.Result != store.AttemptLeaseExpired || a.Duration != lease || a.HTTPStatus != 0 ||
		a.ErrorCode != store.CodeTimeout || !a.StartedAt.Equal(leaseEnd.Add(-lease)) {
		t.Errorf("killed attempt recorded as %+v; want lease_expired from %v for %v", a, leaseEnd.Add(-lease), lease)
	}
	if a := as[1]; a.Attempt != 2 || a.Result != store.AttemptDelivered || a.HTTPStatus != http.StatusNoContent || a.ErrorCode != "" {
		t.Errorf("delivery recorded as %+v", a)
	}
	hits := sink.hits()
	if len(hits) != 2 {
		t.Fatalf("sink saw %d requests, want 2", len(hits))
	}
	if hits[0].id != id || hits[1].id != id || !bytes.Equal(hits[0].body, hits[1].body) || !bytes.Equal(hits[1].body, res.Envelope) {
		t.Fatal("the redelivery is not the same message with the byte-identical stored body")
	}
	if hits[1].at.Before(leaseEnd) {
		t.Fatalf("second attempt at %v, before the first lease ended at %v", hits[1].at, leaseEnd)
	}

	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-second.exited:
		if second.err != nil {
			t.Fatalf("second worker after SIGTERM: %v\n%s", second.err, second.logs)
		}
	case <-time.After(30 * time.Second):
		second.kill()
		t.Fatalf("second worker did not stop within 30s of SIGTERM\n%s", second.logs)
	}
}
