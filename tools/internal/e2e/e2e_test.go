package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
	"github.com/envelopeworker/envelopeworker/tools/internal/envctl"
	"github.com/envelopeworker/envelopeworker/tools/internal/loadgen"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(producerChildEnv) != "" {
		os.Exit(runProducerChild())
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if built.dir != "" {
			_ = os.RemoveAll(built.dir)
		}
		os.Exit(code)
	}))
}

// freeAddr returns a loopback address nothing listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// startIngest builds and starts ingest-api on dsn and returns its base URL; it is stopped with SIGTERM
// when the test ends, and must exit cleanly.
func startIngest(t *testing.T, dsn string) string {
	t.Helper()
	bin := buildService(t, "ingest-api")
	addr := freeAddr(t)
	var logs bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+dsn, "INGEST_ADDR="+addr, "METRICS_ADDR="+freeAddr(t),
		// Wide open: this test is about the tools, not the limiter.
		"SYNC_LIMIT_TOKENS=100000", "SYNC_LIMIT_INTERVAL=1h", "PEER_LIMIT_TOKENS=100000", "PEER_LIMIT_INTERVAL=1h")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("ingest-api did not exit cleanly on SIGTERM: %v\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("ingest-api ignored SIGTERM for 30s")
		}
	})
	url := "http://" + addr
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			t.Fatalf("ingest-api exited during start-up: %v\n%s", err, logs.String())
		default:
		}
		resp, err := client.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("ingest-api not ready after 60s\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

type res struct {
	code           int
	stdout, stderr string
}

func envctlRun(t *testing.T, dsn string, args ...string) res {
	t.Helper()
	var out, errb bytes.Buffer
	code := envctl.Run(context.Background(), args, envctl.Env{
		Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
			if k == "DATABASE_URL" {
				return dsn
			}
			return ""
		},
	})
	return res{code, out.String(), errb.String()}
}

type answer struct {
	Outcome       string `json:"outcome"`
	Reason        string `json:"reason"`
	EventIdentity string `json:"event_identity"`
	Cursor        *int64 `json:"cursor"`
	Status        int    `json:"status"`
	Results       []answer
}

// send runs `envctl send` and returns the HTTP status and the decoded answer.
func send(t *testing.T, url, dir, seedFile, draft string, extra ...string) (int, answer) {
	t.Helper()
	f := filepath.Join(dir, fmt.Sprintf("draft-%d.json", time.Now().UnixNano()))
	if err := os.WriteFile(f, []byte(draft), 0o600); err != nil {
		t.Fatal(err)
	}
	r := envctlRun(t, "", append([]string{"send", "--url", url, "--token-file", filepath.Join(dir, "token"),
		"--seed-file", seedFile, "--file", f}, extra...)...)
	first, body, ok := strings.Cut(r.stdout, "\n")
	var status int
	if _, err := fmt.Sscanf(first, "HTTP %d", &status); err != nil || !ok {
		t.Fatalf("send output %q stderr %q", r.stdout, r.stderr)
	}
	var a answer
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("answer %q: %v", body, err)
	}
	if (status >= 200 && status < 300) != (r.code == envctl.ExitOK) {
		t.Errorf("HTTP %d but exit code %d", status, r.code)
	}
	return status, a
}

func draft(producerID, eventID string, seq int, note string) string {
	return fmt.Sprintf(`{"tenant_id":"demo","project_id":"proj-1","producer_id":%q,"event_id":%q,
 "idempotency_key":"idem-%s","key_id":"demo-key","sequence":%d,"issued_at":"now",
 "metadata":{"kind":"task.status"},"payload":{"note":%q}}`, producerID, eventID, eventID, seq, note)
}

func TestToolsAgainstIngestAPI(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	url := startIngest(t, dsn)
	dir := t.TempDir()

	// Operator set-up with envctl, as scripts/up.sh does it.
	r := envctlRun(t, dsn, "credential", "issue", "--tenant", "demo", "--account", "acct-1", "--device", "device-1", "--role", "device")
	if r.code != 0 {
		t.Fatalf("credential issue: %+v", r)
	}
	if err := access.WriteSecretFile(filepath.Join(dir, "token"), r.stdout); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "seed")
	r = envctlRun(t, "", "keygen", "--seed-file", seed)
	if r.code != 0 {
		t.Fatalf("keygen: %+v", r)
	}
	if r = envctlRun(t, dsn, "key", "add", "--tenant", "demo", "--key-id", "demo-key", "--public-key", strings.TrimSpace(r.stdout)); r.code != 0 {
		t.Fatalf("key add: %+v", r)
	}
	stranger := filepath.Join(dir, "stranger")
	if r = envctlRun(t, "", "keygen", "--seed-file", stranger); r.code != 0 {
		t.Fatalf("keygen: %+v", r)
	}

	// issued_at "now" is resolved to whole seconds when each send runs; the duplicate below must be
	// byte-identical, so it reuses a fixed time.
	fixed := time.Now().UTC().Truncate(time.Second).Format(time.RFC3339)
	d2 := strings.Replace(draft("device-1", "evt-2", 2, "two"), `"now"`, `"`+fixed+`"`, 1)
	steps := []struct {
		name   string
		draft  string
		seed   string
		extra  []string
		status int
		want   string // outcome, or reason for refusals
		cursor int64  // -1: no cursor in the answer
	}{
		{"in order", draft("device-1", "evt-1", 1, "one"), seed, nil, 200, "accepted", 1},
		{"in order", d2, seed, nil, 200, "accepted", 2},
		{"duplicate", d2, seed, nil, 200, "duplicate", 2},
		{"gap", draft("device-1", "evt-4", 4, "four"), seed, nil, 200, "accepted", 2},
		{"fill", draft("device-1", "evt-3", 3, "three"), seed, nil, 200, "accepted", 4},
		{"event conflict", draft("device-1", "evt-1", 5, "changed"), seed, nil, 409, "event_conflict", -1},
		{"route mismatch", draft("device-2", "evt-r", 5, "r"), seed, nil, 403, "route_mismatch", -1},
		{"bad signature", draft("device-1", "evt-s", 5, "s"), stranger, nil, 403, "bad_signature", -1},
		{"header mismatch", draft("device-1", "evt-h", 5, "h"), seed, []string{"--idempotency-header", "other"}, 400, "idempotency_key_mismatch", -1},
		{"header match", draft("device-1", "evt-5", 5, "five"), seed, []string{"--idempotency-header", "="}, 200, "accepted", 5},
	}
	for _, s := range steps {
		status, a := send(t, url, dir, s.seed, s.draft, s.extra...)
		got := a.Outcome
		if got == "refused" {
			got = a.Reason
		}
		if status != s.status || got != s.want {
			t.Fatalf("%s: HTTP %d %+v; want HTTP %d %s", s.name, status, a, s.status, s.want)
		}
		if s.cursor >= 0 && (a.Cursor == nil || *a.Cursor != s.cursor) {
			t.Fatalf("%s: cursor %v, want %d", s.name, a.Cursor, s.cursor)
		}
	}

	batch := "[" + draft("device-1", "evt-6", 6, "six") + "," + draft("device-1", "evt-7", 7, "seven") + "]"
	status, a := send(t, url, dir, seed, batch, "--batch")
	if status != 200 || len(a.Results) != 2 || a.Results[0].Outcome != "accepted" || a.Results[1].Status != 200 ||
		a.Results[1].Cursor == nil || *a.Results[1].Cursor != 7 {
		t.Fatalf("batch: HTTP %d %+v", status, a)
	}

	r = envctlRun(t, dsn, "stream", "show", "--tenant", "demo", "--project", "proj-1", "--producer", "device-1")
	if r.code != 0 || r.stdout != `{"cursor":7,"replay_floor":0}`+"\n" {
		t.Fatalf("stream show: %+v", r)
	}
	// Every answer from step 2 on is audited: 10 single answers and 2 batch items.
	r = envctlRun(t, dsn, "audit", "list", "--tenant", "demo", "--limit", "1000")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 12 {
		t.Fatalf("audit list: %d lines, %+v", strings.Count(r.stdout, "\n"), r)
	}

	// The load generator: set-up through the store, then both routes with several producers.
	s := storetest.Open(t, dsn)
	creds, err := loadgen.Setup(context.Background(), s, loadgen.SetupConfig{Tenant: "lg", Account: "lg", Prefix: "lg-e2e", Producers: 4})
	if err != nil {
		t.Fatal(err)
	}
	u, err := access.CheckURL(url, true)
	if err != nil {
		t.Fatal(err)
	}
	// Raw (pre-signed) and through the producer module (--sdk), on both routes.
	for _, run := range []struct {
		b   int
		sdk bool
	}{{0, false}, {25, false}, {0, true}, {25, true}} {
		b := run.b
		plan, err := loadgen.NewPlan(loadgen.Config{URL: u, Creds: creds, Producers: 4, Count: 202, Batch: b, Timeout: 30 * time.Second, SDK: run.sdk})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := plan.Run(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() || rep.Accepted != 202 {
			t.Fatalf("loadgen batch=%d sdk=%v: %s", b, run.sdk, rep)
		}
		// The streams are complete: every producer's cursor is at its last sequence (51, 51, 50, 50).
		for i, want := range []int64{51, 51, 50, 50} {
			st, err := s.Inbound().Stream(context.Background(), "lg", plan.Project(), creds.Producers[i].Device)
			if err != nil || st.Cursor != want {
				t.Errorf("batch=%d producer %d: cursor %d, %v; want %d", b, i, st.Cursor, err, want)
			}
		}
	}
}
