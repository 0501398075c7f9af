package e2e

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// The producer child is this test binary run again with producerChildEnv
// set: a real process that the test can SIGKILL, holding its state only in
// the producer's file store, as a device would.
const producerChildEnv = "E2E_PRODUCER_CHILD"

const (
	crashTenant   = "crash"
	crashProject  = "proj-1"
	crashDevice   = "device-c"
	crashKeyID    = "crash-key"
	crashEvents   = 12
	crashChildMax = 30 * time.Second
)

func crashEvent(i int) producer.Event {
	return producer.Event{
		EventID:  fmt.Sprintf("evt-%d", i),
		Metadata: envelope.Metadata{Kind: "crash.test"},
		Payload:  []byte(fmt.Sprintf(`{"i":%d}`, i)),
	}
}

// runProducerChild resumes, printing "handed i" for each re-sent envelope
// of event i, then sends events FROM..TO, printing "handed i" when Send
// returned. Exit 0 when all are delivered, 2 on a refusal, 1 on any other
// failure.
func runProducerChild() int {
	seed, _ := hex.DecodeString(os.Getenv("CHILD_SEED"))
	from, _ := strconv.Atoi(os.Getenv("CHILD_FROM"))
	to, _ := strconv.Atoi(os.Getenv("CHILD_TO"))
	signer, err := envelope.NewSigner(crashKeyID, ed25519.NewKeyFromSeed(seed))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	p, err := producer.New(os.Getenv("CHILD_URL"), os.Getenv("CHILD_TOKEN"), signer,
		producer.WithStream(producer.Stream{TenantID: os.Getenv("CHILD_TENANT"), ProjectID: crashProject, ProducerID: crashDevice}),
		producer.WithStore(producer.NewFileStore(os.Getenv("CHILD_STATE"))),
		producer.WithBackoff(10*time.Millisecond, 200*time.Millisecond), producer.WithDeadline(crashChildMax))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	resent, err := p.Resume(context.Background())
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	for _, r := range resent {
		if !r.Delivered() {
			fmt.Println("refused", r.EventID, r.Reason)
			return 2
		}
		i, _ := strconv.Atoi(strings.TrimPrefix(r.EventID, "evt-"))
		fmt.Println("handed", i)
		from = max(from, i+1)
	}
	for i := from; i <= to; i++ {
		r, err := p.Send(context.Background(), crashEvent(i))
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		if !r.Delivered() {
			fmt.Println("refused", i, r.Reason)
			return 2
		}
		fmt.Println("handed", i)
	}
	return 0
}

// TestProducerKilledBetweenSendAndAnswer runs the producer against the real
// ingest-api through a proxy that, on chosen POSTs, lets the service commit
// and then SIGKILLs the producer before it can read the answer. Each restart
// resumes from the file store: the stream must end contiguous, holding every
// event exactly once.
func TestProducerKilledBetweenSendAndAnswer(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	ingest := startIngest(t, dsn)
	dir := t.TempDir()

	token, seed := setUpCrashDevice(t, dsn, crashTenant)

	// Kill points per run: the third POST of a fresh run, the first POST of
	// a restart (the re-send of the envelope whose answer was lost), the
	// fourth; the last run is not killed.
	runKilledProducer(t, ingest, crashTenant, token, seed, filepath.Join(dir, "producer-state.json"), crashEvents, []int64{3, 1, 4, 0})
	checkProducerStream(t, storetest.Open(t, dsn), crashTenant, crashEvents)
}

// setUpCrashDevice issues the crash producer's device credential in tenant
// and registers its key; it returns the token and the key's seed.
func setUpCrashDevice(t *testing.T, dsn, tenant string) (string, []byte) {
	t.Helper()
	r := envctlRun(t, dsn, "credential", "issue", "--tenant", tenant, "--account", "acct-1", "--device", crashDevice, "--role", "device")
	if r.code != 0 {
		t.Fatalf("credential issue: %+v", r)
	}
	token := strings.TrimSpace(r.stdout)
	seed := make([]byte, ed25519.SeedSize)
	seed[0] = 42
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	if r = envctlRun(t, dsn, "key", "add", "--tenant", tenant, "--key-id", crashKeyID, "--public-key", base64.RawURLEncoding.EncodeToString(pub)); r.code != 0 {
		t.Fatalf("key add: %+v", r)
	}

	return token, seed
}

// checkProducerStream checks that the crash producer's stream holds events
// 1..events exactly once each, at sequences 1..events, with the cursor at
// the top.
func checkProducerStream(t *testing.T, s *store.Store, tenant string, events int) {
	t.Helper()
	rows, cursor, err := s.Inbound().ReadStream(context.Background(), tenant, crashProject, crashDevice, 0, 100, envelope.MaxPageBytes)
	if err != nil {
		t.Fatal(err)
	}
	if cursor != int64(events) || len(rows) != events {
		t.Fatalf("cursor %d with %d envelopes, want %d contiguous", cursor, len(rows), events)
	}
	seen := map[string]int64{}
	for i, row := range rows {
		e, err := envelope.Parse(row.Envelope)
		if err != nil {
			t.Fatal(err)
		}
		if row.Sequence != int64(i+1) || e.Sequence != row.Sequence {
			t.Fatalf("row %d has sequence %d", i, row.Sequence)
		}
		if prev, dup := seen[e.EventID]; dup {
			t.Fatalf("%s held twice, at %d and %d", e.EventID, prev, row.Sequence)
		}
		seen[e.EventID] = row.Sequence
	}
	for i := 1; i <= events; i++ {
		if _, ok := seen[crashEvent(i).EventID]; !ok {
			t.Fatalf("%s lost", crashEvent(i).EventID)
		}
	}
}

// TestEnvctlSendStateFile sends with `envctl send --state-file` to the real ingest-api: the producer
// module numbers the drafts, and a second run continues the stream.
func TestEnvctlSendStateFile(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	ingest := startIngest(t, dsn)
	dir := t.TempDir()
	r := envctlRun(t, dsn, "credential", "issue", "--tenant", "demo", "--account", "acct-1", "--device", "device-1", "--role", "device")
	if r.code != 0 {
		t.Fatalf("credential issue: %+v", r)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "seed")
	if r = envctlRun(t, "", "keygen", "--seed-file", seed); r.code != 0 {
		t.Fatalf("keygen: %+v", r)
	}
	if r = envctlRun(t, dsn, "key", "add", "--tenant", "demo", "--key-id", "demo-key", "--public-key", strings.TrimSpace(r.stdout)); r.code != 0 {
		t.Fatalf("key add: %+v", r)
	}
	unsequenced := func(id string) string {
		return fmt.Sprintf(`{"tenant_id":"demo","project_id":"proj-1","producer_id":"device-1","event_id":%q,
 "idempotency_key":"idem-%s","key_id":"demo-key","issued_at":"now","metadata":{"kind":"task.status"},"payload":{}}`, id, id)
	}
	state := filepath.Join(dir, "state.json")
	for i, files := range []struct {
		draft string
		batch bool
		want  string
	}{
		{unsequenced("a"), false, `{"event_id":"a","sequence":1,"outcome":"accepted","status":200,"cursor":1}` + "\n"},
		{"[" + unsequenced("b") + "," + unsequenced("c") + "]", true,
			`{"event_id":"b","sequence":2,"outcome":"accepted","status":200,"cursor":2}` + "\n" +
				`{"event_id":"c","sequence":3,"outcome":"accepted","status":200,"cursor":3}` + "\n"},
	} {
		f := filepath.Join(dir, fmt.Sprintf("draft-%d.json", i))
		if err := os.WriteFile(f, []byte(files.draft), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"send", "--url", ingest, "--token-file", token, "--seed-file", seed, "--state-file", state, "--file", f}
		if files.batch {
			args = append(args, "--batch")
		}
		if r = envctlRun(t, "", args...); r.code != 0 || r.stdout != files.want {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
}

// runKilledProducer runs the producer child (events 1..events of tenant's
// stream, state in the file state) once per entry of kills, against ingest
// through a proxy that, on the kill-th POST of the run, lets the service
// commit and then SIGKILLs the child before it can read the answer (0: the
// run is not killed). Each restart resumes from the file store and goes on
// after the last event handed over; the last run must hand over the rest.
func runKilledProducer(t *testing.T, ingest, tenant, token string, seed []byte, state string, events int, kills []int64) {
	t.Helper()
	target, _ := url.Parse(ingest)
	var (
		posts  atomic.Int64
		killOn atomic.Int64 // the POST, counted from the child's start, whose answer kills it
		mu     sync.Mutex
		child  *exec.Cmd
	)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost || posts.Add(1) != killOn.Load() {
			return nil
		}
		// The service has answered, so it has committed; the producer dies
		// before it reads a byte of the answer.
		mu.Lock()
		child.Process.Kill()
		mu.Unlock()
		return fmt.Errorf("producer killed")
	}
	proxy.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	front := httptest.NewServer(proxy)
	defer front.Close()

	next := 1
	for run, kill := range kills {
		posts.Store(0)
		killOn.Store(kill)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), producerChildEnv+"=1", "CHILD_URL="+front.URL, "CHILD_TOKEN="+token, "CHILD_TENANT="+tenant,
			"CHILD_SEED="+hex.EncodeToString(seed), "CHILD_STATE="+state,
			"CHILD_FROM="+strconv.Itoa(next), "CHILD_TO="+strconv.Itoa(events))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		mu.Lock()
		child = cmd
		err = cmd.Start()
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		// The child gives up on its own after crashChildMax; this bounds a
		// child that hangs anyway.
		stuck := time.AfterFunc(crashChildMax+10*time.Second, func() { _ = cmd.Process.Kill() })
		var lines []string
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines = append(lines, sc.Text())
		}
		werr := cmd.Wait()
		stuck.Stop()
		// The application hands each event over once: after a crash it goes
		// on after the last one Send returned or Resume re-sent. One whose
		// Send was cut short is either in neither (not saved yet: send it
		// again) or re-sent by the next Resume.
		for _, l := range lines {
			if n, ok := strings.CutPrefix(l, "handed "); ok {
				i, _ := strconv.Atoi(n)
				next = i + 1
			}
			if strings.HasPrefix(l, "refused") || strings.HasPrefix(l, "error") {
				t.Fatalf("run %d: %s", run, l)
			}
		}
		killed := kill > 0
		if killed != (werr != nil) {
			t.Fatalf("run %d: kill planned %v, exit %v, output %q", run, killed, werr, lines)
		}
		t.Logf("run %d (kill on POST %d): %d lines, next event %d", run, kill, len(lines), next)
	}
	if next != events+1 {
		t.Fatalf("the runs handed over events up to %d, want %d", next-1, events)
	}

}
