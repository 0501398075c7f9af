package envctl

import (
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// receiver stands in for ingest-api's HTTP surface only: it records what arrived and answers with a
// fixed status, so the tests can check what envctl send put on the wire.
type receiver struct {
	mu       sync.Mutex
	status   int
	answer   string
	path     string
	auth     string
	idemHdr  string
	hasIdem  bool
	body     []byte
	requests int
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.requests++
	rc.path, rc.auth = r.URL.Path, r.Header.Get("Authorization")
	rc.idemHdr = r.Header.Get("Idempotency-Key")
	_, rc.hasIdem = r.Header["Idempotency-Key"]
	rc.body, _ = io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(rc.status)
	io.WriteString(w, rc.answer)
}

type sendFixture struct {
	dir, tokenFile, seedFile string
	token                    string
	pub                      ed25519.PublicKey
	rc                       *receiver
	srv                      *httptest.Server
	now                      time.Time
}

func newSendFixture(t *testing.T) *sendFixture {
	t.Helper()
	f := &sendFixture{dir: t.TempDir(), token: "ewc_test-token-value", rc: &receiver{status: 200, answer: `{"outcome":"accepted","cursor":1}`}}
	f.now = time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	f.pub = pub
	f.tokenFile = filepath.Join(f.dir, "token")
	f.seedFile = filepath.Join(f.dir, "seed")
	if err := access.WriteSecretFile(f.tokenFile, f.token+"\n"); err != nil {
		t.Fatal(err)
	}
	if err := access.WriteSecretFile(f.seedFile, access.EncodeBase64URL(priv.Seed())+"\n"); err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewServer(f.rc)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *sendFixture) file(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (f *sendFixture) send(t *testing.T, args ...string) result {
	t.Helper()
	return runEnv(t, Env{Now: func() time.Time { return f.now }}, append([]string{"send"}, args...)...)
}

func draftJSON(seq int, producerID string) string {
	return `{"tenant_id":"t1","project_id":"p1","producer_id":"` + producerID + `","event_id":"e-` + itoa(seq) +
		`","idempotency_key":"k-` + itoa(seq) + `","key_id":"key-1","sequence":` + itoa(seq) +
		`,"metadata":{"kind":"task.status"},"payload":{"secret-payload-marker":` + itoa(seq) + `}}`
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func (f *sendFixture) noSecrets(t *testing.T, r result) {
	t.Helper()
	seed, _ := os.ReadFile(f.seedFile)
	for _, secret := range []string{f.token, strings.TrimSpace(string(seed))} {
		if strings.Contains(r.stdout+r.stderr, secret) {
			t.Fatalf("a secret leaked into the output: %q %q", r.stdout, r.stderr)
		}
	}
}

func TestSendSingle(t *testing.T) {
	f := newSendFixture(t)
	draft := f.file(t, "d.json", draftJSON(1, "d1"))
	r := f.send(t, "--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", draft)
	r.expect(t, ExitOK, "")
	if r.stdout != "HTTP 200\n"+`{"outcome":"accepted","cursor":1}`+"\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	f.noSecrets(t, r)
	if f.rc.path != "/v1/envelopes" || f.rc.auth != "Bearer "+f.token || f.rc.hasIdem {
		t.Errorf("request path %q auth %q idempotency header %v", f.rc.path, f.rc.auth, f.rc.hasIdem)
	}
	e, err := envelope.Parse(f.rc.body)
	if err != nil {
		t.Fatalf("the body is not a valid envelope: %v", err)
	}
	if err := e.Verify(f.pub); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if string(f.rc.body) != string(e.Canonical()) {
		t.Error("the body is not the canonical form")
	}
	if e.ProducerID != "d1" || e.Sequence != 1 || e.KeyID != "key-1" || !e.IssuedAt.Equal(f.now) {
		t.Errorf("envelope %+v", e)
	}
	if err := e.Validate(f.now, time.Hour); err != nil {
		t.Errorf("step 4: %v", err)
	}

	// The draft from stdin, the token as a flag, the header copied from the draft.
	r = runEnv(t, Env{Now: func() time.Time { return f.now }, Stdin: strings.NewReader(draftJSON(2, "d1"))},
		"send", "--url", f.srv.URL, "--token", f.token, "--seed-file", f.seedFile, "--file", "-", "--idempotency-header", "=")
	r.expect(t, ExitOK, "")
	if f.rc.idemHdr != "k-2" {
		t.Errorf("Idempotency-Key %q, want the draft's k-2", f.rc.idemHdr)
	}
	f.send(t, "--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", draft,
		"--idempotency-header", "other").expect(t, ExitOK, "")
	if f.rc.idemHdr != "other" {
		t.Errorf("Idempotency-Key %q, want other", f.rc.idemHdr)
	}
}

func TestSendRefusalAnswer(t *testing.T) {
	f := newSendFixture(t)
	f.rc.status, f.rc.answer = http.StatusForbidden, `{"outcome":"refused","reason":"route_mismatch","correlation_id":"c1"}`
	draft := f.file(t, "d.json", draftJSON(1, "someone-else"))
	r := f.send(t, "--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", draft)
	if r.code != ExitFailure || r.stdout != "HTTP 403\n"+f.rc.answer+"\n" {
		t.Errorf("a refusal: code %d stdout %q", r.code, r.stdout)
	}
}

func TestSendBatch(t *testing.T) {
	f := newSendFixture(t)
	f.rc.answer = `{"results":[]}`
	for _, doc := range []string{
		`{"envelopes":[` + draftJSON(1, "d1") + `,` + draftJSON(2, "d1") + `]}`,
		`[` + draftJSON(1, "d1") + `,` + draftJSON(2, "d1") + `]`,
	} {
		r := f.send(t, "--url", f.srv.URL+"/", "--token-file", f.tokenFile, "--seed-file", f.seedFile,
			"--file", f.file(t, "b.json", doc), "--batch")
		r.expect(t, ExitOK, "")
		if f.rc.path != "/v1/envelopes/batch" {
			t.Errorf("path %q", f.rc.path)
		}
		items, err := envelope.SplitBatch(f.rc.body)
		if err != nil || len(items) != 2 {
			t.Fatalf("batch body: %d items, %v", len(items), err)
		}
		for i, it := range items {
			e, err := envelope.Parse(it)
			if err != nil {
				t.Fatal(err)
			}
			if e.Verify(f.pub) != nil || e.Sequence != int64(i+1) {
				t.Errorf("item %d: sequence %d, verify %v", i, e.Sequence, e.Verify(f.pub))
			}
		}
	}
}

func TestSendRefusals(t *testing.T) {
	f := newSendFixture(t)
	good := f.file(t, "good.json", draftJSON(1, "d1"))
	signed := f.file(t, "signed.json", strings.Replace(draftJSON(1, "d1"), `"tenant_id"`, `"signature":"x","tenant_id"`, 1))
	typo := f.file(t, "typo.json", strings.Replace(draftJSON(1, "d1"), `"sequence"`, `"Sequence"`, 1))
	badIdentity := f.file(t, "bad.json", strings.Replace(draftJSON(1, "d1"), `"p1"`, `"p 1"`, 1))
	big := f.file(t, "big.json", `{"payload":"`+strings.Repeat("a", maxDraftFile)+`"}`)
	wrongSeed := f.file(t, "wrongseed", "AAAA\n")
	base := []string{"--url", f.srv.URL, "--seed-file", f.seedFile, "--file", good}
	cases := []struct {
		name string
		args []string
		msg  string
	}{
		{"no token", base, "--token-file (or --token) is required"},
		{"both tokens", append(base, "--token", "x", "--token-file", f.tokenFile), "not both"},
		{"token with space", append(base, "--token", "a b"), "--token: token has characters outside printable ASCII"},
		{"missing token file", append(base, "--token-file", filepath.Join(f.dir, "nope")), "no such file"},
		{"no seed", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--file", good}, "--seed-file is required"},
		{"bad seed", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", wrongSeed, "--file", good}, "seed is 3 bytes, want 32"},
		{"no file", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile}, "--file is required"},
		{"missing file", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", filepath.Join(f.dir, "none.json")}, "no such file"},
		{"draft with signature", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", signed}, `must not carry a "signature"`},
		{"draft member typo", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", typo}, `unknown member(s) "Sequence"`},
		{"draft identity", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", badIdentity}, "cannot sign"},
		{"draft too big", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", big}, "larger than 1048576 bytes"},
		{"single draft as batch", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", good, "--batch"}, "batch draft"},
		{"header on batch", []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", good, "--batch", "--idempotency-header", "x"}, "single route only"},
		{"plain http afar", []string{"--url", "http://ingest.example.com", "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--file", good}, "plain http is only allowed to loopback"},
		{"zero timeout", append(base, "--token-file", f.tokenFile, "--timeout", "0s"), "--timeout must be positive"},
	}
	for _, c := range cases {
		r := f.send(t, c.args...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, c.msg) || r.stdout != "" {
			t.Errorf("%s: code %d stdout %q stderr %q; want exit 2 mentioning %q", c.name, r.code, r.stdout, r.stderr, c.msg)
		}
		f.noSecrets(t, r)
	}
	if f.rc.requests != 0 {
		t.Errorf("%d requests were sent for refused command lines", f.rc.requests)
	}

	// A service that is not there: exit 1, nothing on stdout.
	f.srv.Close()
	r := f.send(t, append(base, "--token-file", f.tokenFile)...)
	if r.code != ExitFailure || r.stdout != "" || !strings.Contains(r.stderr, "post ") {
		t.Errorf("dead service: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	f.noSecrets(t, r)
}

func TestKeygen(t *testing.T) {
	r := run(t, "", "keygen")
	r.expect(t, ExitOK, "")
	var out map[string]string
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || len(out) != 2 {
		t.Fatalf("keygen stdout %q: %v", r.stdout, err)
	}
	priv, err := access.ParseSeed(out["seed"])
	if err != nil {
		t.Fatal(err)
	}
	pub, err := envelope.ParsePublicKey(out["public_key"])
	if err != nil || !pub.Equal(priv.Public()) {
		t.Fatalf("public key %q does not belong to the seed: %v", out["public_key"], err)
	}

	path := filepath.Join(t.TempDir(), "seed")
	r = run(t, "", "keygen", "--seed-file", path)
	r.expect(t, ExitOK, "")
	pubText := strings.TrimSuffix(r.stdout, "\n")
	priv, err = access.ReadSeedFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if pub, err := envelope.ParsePublicKey(pubText); err != nil || !pub.Equal(priv.Public()) {
		t.Fatalf("printed key %q does not belong to the written seed: %v", pubText, err)
	}
	if strings.Contains(r.stdout, access.EncodeBase64URL(priv.Seed())) {
		t.Error("keygen --seed-file printed the seed")
	}
	r = run(t, "", "keygen", "--seed-file", path)
	if r.code != ExitFailure || !strings.Contains(r.stderr, "exists") {
		t.Errorf("overwriting a seed file: code %d stderr %q", r.code, r.stderr)
	}
	if again, _ := access.ReadSeedFile(path); !again.Equal(priv) {
		t.Error("the seed file changed")
	}
}
