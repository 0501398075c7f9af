package e2e

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// outboxStack is ingest-api, built from this repository, with an outbound key for tenant "ob", a
// service and a device credential, and one active endpoint of proj-1/t.ok (never called: no worker runs).
type outboxStack struct {
	dsn, keysFile, svc, device string
	bin                        string
	admin                      *sql.DB
}

func newOutboxStack(t *testing.T) *outboxStack {
	t.Helper()
	s := &outboxStack{dsn: storetest.NewDatabase(t)}
	issue := func(device, role string) string {
		r := envctlRun(t, s.dsn, "credential", "issue", "--tenant", "ob", "--account", "acct-1", "--device", device, "--role", role)
		if r.code != 0 {
			t.Fatalf("credential issue: %+v", r)
		}
		return strings.TrimSpace(r.stdout)
	}
	s.svc, s.device = issue("svc-1", "service"), issue("device-1", "device")
	seed, _ := randomB64(t, 32, base64.RawURLEncoding)
	s.keysFile = filepath.Join(t.TempDir(), "outbound-keys.json")
	if err := os.WriteFile(s.keysFile, []byte(`{"ob":{"key_id":"out-1","seed":"`+seed+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := envctlRun(t, s.dsn, "endpoint", "add", "--tenant", "ob", "--project", "proj-1", "--topic", "t.ok",
		"--url", "https://hooks.example.test/ok", "--secret-ref", "ob-ref"); r.code != 0 {
		t.Fatalf("endpoint add: %+v", r)
	}
	s.bin = buildService(t, "ingest-api")
	s.admin = storetest.AdminDB(t, s.dsn)
	return s
}

// start runs the built ingest-api and returns its base URL and the running command; the caller kills
// or stops it (a cleanup kills what is left).
func (s *outboxStack) start(t *testing.T, extra ...string) (string, *exec.Cmd, *lockedBuffer) {
	t.Helper()
	addr := freeAddr(t)
	logs := &lockedBuffer{}
	cmd := exec.Command(s.bin)
	cmd.Env = append(os.Environ(), append([]string{"DATABASE_URL=" + s.dsn, "INGEST_ADDR=" + addr,
		"METRICS_ADDR=" + freeAddr(t), "OUTBOUND_SIGNING_KEYS_FILE=" + s.keysFile, "LOG_LEVEL=warn",
		"SYNC_LIMIT_TOKENS=100000", "SYNC_LIMIT_INTERVAL=1h", "PEER_LIMIT_TOKENS=100000", "PEER_LIMIT_INTERVAL=1h",
		"OUTBOX_LIMIT_TOKENS=100000", "OUTBOX_LIMIT_INTERVAL=1h"}, extra...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	url := "http://" + addr
	client := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(60 * time.Second); ; {
		if resp, err := client.Get(url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, cmd, logs
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ingest-api not ready after 60s\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *outboxStack) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	if err := s.admin.QueryRowContext(context.Background(), query).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// contiguous fails unless the outbound stream's sequences are exactly 1..last_sequence.
func (s *outboxStack) contiguous(t *testing.T) int {
	t.Helper()
	n := s.count(t, `SELECT count(*) FROM outbound_envelopes`)
	if last := s.count(t, `SELECT coalesce(max(last_sequence), 0) FROM outbound_streams`); last != n ||
		s.count(t, `SELECT coalesce(max(sequence), 0) FROM outbound_envelopes`) != n {
		t.Fatalf("%d envelopes but the stream is at %d: sequences are not 1..n", n, last)
	}
	return n
}

func obBody(key, note string) []byte {
	return fmt.Appendf(nil, `{"project_id":"proj-1","topic":"t.ok","idempotency_key":%q,"kind":"proposal","payload":{"note":%q}}`, key, note)
}

type obResult struct {
	Envelope   json.RawMessage `json:"envelope"`
	MessageIDs []string        `json:"message_ids"`
	Outcome    string          `json:"outcome"`
	Reason     string          `json:"reason"`
	Status     int             `json:"status"`
}

// Every outbox enqueue route and refusal through the real binary (contract §4, §8.5).
func TestOutboxEnqueueRoutesEndToEnd(t *testing.T) {
	s := newOutboxStack(t)
	api, _, _ := s.start(t)
	post := func(route, token string, body []byte) (int, obResult, string) {
		a := call(t, http.MethodPost, api+route, token, body)
		var r obResult
		_ = json.Unmarshal([]byte(a.body), &r)
		return a.status, r, a.body
	}

	// The single route: created, repeated byte for byte, conflict, no endpoint, wrong role, bad body.
	st, first, _ := post("/v1/outbox", s.svc, obBody("k-1", "a"))
	if st != http.StatusCreated || len(first.MessageIDs) != 1 {
		t.Fatalf("enqueue: %d %+v", st, first)
	}
	if st, again, _ := post("/v1/outbox", s.svc, obBody("k-1", "a")); st != http.StatusOK || string(again.Envelope) != string(first.Envelope) {
		t.Fatalf("repeat: %d", st)
	}
	for _, c := range []struct {
		token  string
		body   []byte
		status int
		reason string
	}{
		{s.svc, obBody("k-1", "other"), 422, "idempotency_conflict"},
		{s.svc, []byte(`{"project_id":"proj-1","topic":"t.none","idempotency_key":"k-2","kind":"proposal","payload":{}}`), 422, "no_endpoint"},
		{s.device, obBody("k-3", "a"), 403, "forbidden"},
		{s.svc, []byte(`{"project_id":"proj-1"}`), 400, "invalid_request"},
	} {
		if st, r, _ := post("/v1/outbox", c.token, c.body); st != c.status || r.Reason != c.reason {
			t.Fatalf("%s: %d %q, want %d %s", c.body, st, r.Reason, c.status, c.reason)
		}
	}

	// The batch route: per-item answers in order, as one by one.
	batch := `{"messages":[` + strings.Join([]string{string(obBody("k-4", "a")), string(obBody("k-4", "a")),
		string(obBody("k-1", "a")), string(obBody("k-1", "b")), `7`, string(obBody("k-5", "a"))}, ",") + `]}`
	st, _, raw := post("/v1/outbox/batch", s.svc, []byte(batch))
	var out struct{ Results []obResult }
	if err := json.Unmarshal([]byte(raw), &out); err != nil || st != http.StatusOK || len(out.Results) != 6 {
		t.Fatalf("batch: %d %s", st, raw)
	}
	for i, want := range []int{201, 200, 200, 422, 400, 201} {
		if out.Results[i].Status != want {
			t.Fatalf("batch item %d: status %d, want %d (%s)", i, out.Results[i].Status, want, raw)
		}
	}
	if string(out.Results[2].Envelope) != string(first.Envelope) || string(out.Results[1].Envelope) != string(out.Results[0].Envelope) {
		t.Fatal("a batch repeat answered another envelope")
	}

	// Malformed wrappers and oversized bodies store nothing.
	before := s.count(t, `SELECT count(*) FROM outbound_envelopes`)
	many := make([]string, 101)
	for i := range many {
		many[i] = string(obBody(fmt.Sprintf("k-many-%d", i), "a"))
	}
	for _, c := range []struct {
		body   string
		status int
		reason string
	}{
		{`[` + string(obBody("k-6", "a")) + `]`, 400, "invalid_request"},
		{`{"messages":[` + string(obBody("k-6", "a")) + `],"more":1}`, 400, "invalid_request"},
		{`{"messages":[]}`, 400, "invalid_request"},
		{`{"messages":[` + strings.Join(many, ",") + `]}`, 400, "invalid_request"},
		{`{"messages":[` + string(obBody("k-6", strings.Repeat("x", 1<<20))) + `]}`, 413, "body_too_large"},
	} {
		if st, r, _ := post("/v1/outbox/batch", s.svc, []byte(c.body)); st != c.status || r.Reason != c.reason {
			t.Fatalf("wrapper %.60s…: %d %q, want %d %s", c.body, st, r.Reason, c.status, c.reason)
		}
	}
	if st, r, _ := post("/v1/outbox/batch", s.device, []byte(`{"messages":[`+string(obBody("k-7", "a"))+`]}`)); st != 403 || r.Reason != "forbidden" {
		t.Fatalf("device on the batch route: %d %q", st, r.Reason)
	}
	if after := s.count(t, `SELECT count(*) FROM outbound_envelopes`); after != before {
		t.Fatalf("refused batches stored %d envelopes", after-before)
	}

	// One busy producer: 64 concurrent requests of one credential keep the stream contiguous.
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			a := call(t, http.MethodPost, api+"/v1/outbox", s.svc, obBody(fmt.Sprintf("k-c-%d", i), "a"))
			if a.status != http.StatusCreated {
				t.Errorf("concurrent enqueue %d: %d %s", i, a.status, a.body)
			}
		})
	}
	wg.Wait()
	if n := s.contiguous(t); n != 3+64 { // k-1, k-4, k-5 and the 64
		t.Fatalf("%d envelopes, want %d", n, 3+64)
	}
}

// A SIGKILLed ingest-api in the middle of a busy producer's groups acknowledges nothing it did not
// commit: every message id a client was given is in the database, and after a restart the unanswered
// requests, sent again, are created or repeated with the stream still contiguous.
func TestOutboxGroupCommitSurvivesKill(t *testing.T) {
	s := newOutboxStack(t)
	api, cmd, _ := s.start(t)
	const clients, per = 32, 40
	var mu sync.Mutex
	acked := map[string][]string{} // key -> message ids
	var unanswered []string
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 5 * time.Second}
	for c := range clients {
		wg.Go(func() {
			for i := range per {
				key := fmt.Sprintf("k-%d-%d", c, i)
				req, _ := http.NewRequest(http.MethodPost, api+"/v1/outbox", strings.NewReader(string(obBody(key, "a"))))
				req.Header.Set("Authorization", "Bearer "+s.svc)
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				var r obResult
				status := 0
				if err == nil {
					status = resp.StatusCode
					_ = json.NewDecoder(resp.Body).Decode(&r)
					resp.Body.Close()
				}
				mu.Lock()
				if status == http.StatusCreated || status == http.StatusOK {
					acked[key] = r.MessageIDs
				} else {
					unanswered = append(unanswered, key)
				}
				mu.Unlock()
			}
		})
	}
	// Kill while groups are in flight: after some answers, long before the last.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= clients*per/4 || time.Now().After(deadline) {
			break
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(acked) == 0 || len(unanswered) == 0 {
		t.Fatalf("the kill did not land mid-load: %d answered, %d unanswered", len(acked), len(unanswered))
	}
	for key, ids := range acked {
		for _, id := range ids {
			if s.count(t, `SELECT count(*) FROM outbox_messages WHERE message_id = '`+id+`'`) != 1 {
				t.Fatalf("%s: message %s was acknowledged but is not in the database", key, id)
			}
		}
	}
	s.contiguous(t)

	api, _, _ = s.start(t)
	for _, key := range unanswered {
		a := call(t, http.MethodPost, api+"/v1/outbox", s.svc, obBody(key, "a"))
		if a.status != http.StatusCreated && a.status != http.StatusOK {
			t.Fatalf("resend %s: %d %s", key, a.status, a.body)
		}
	}
	if n := s.contiguous(t); n != clients*per {
		t.Fatalf("%d envelopes after the resends, want %d", n, clients*per)
	}
}
