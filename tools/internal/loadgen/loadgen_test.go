package loadgen

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSetup(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	creds, err := Setup(ctx, s, SetupConfig{Tenant: "lt", Account: "la", Prefix: "p-x", Producers: 3})
	if err != nil {
		t.Fatal(err)
	}
	if creds.Tenant != "lt" || creds.Account != "la" || len(creds.Producers) != 3 {
		t.Fatalf("creds %+v", creds)
	}
	for i, p := range creds.Producers {
		wantDevice := fmt.Sprintf("p-x-%04d", i+1)
		if p.Device != wantDevice || p.KeyID != wantDevice {
			t.Errorf("producer %d: %+v", i, p)
		}
		id, err := s.Credentials().VerifyCredential(ctx, p.Token)
		if err != nil {
			t.Fatal(err)
		}
		if id.TenantID != "lt" || id.AccountID != "la" || id.DeviceID != wantDevice || id.Role != "device" {
			t.Errorf("identity %+v", id)
		}
		priv, err := access.ParseSeed(p.Seed)
		if err != nil {
			t.Fatal(err)
		}
		k, err := s.Credentials().LookupKey(ctx, "lt", p.KeyID)
		if err != nil {
			t.Fatal(err)
		}
		if !k.PublicKey.Equal(priv.Public()) || k.State != store.KeyState("active") {
			t.Errorf("key %s: %+v does not match the seed", p.KeyID, k)
		}
	}
	if _, err := Setup(ctx, s, SetupConfig{Tenant: "lt", Account: "la", Prefix: "p-x", Producers: 1}); err == nil ||
		!strings.Contains(err.Error(), "use another --prefix") || !errors.Is(err, store.ErrConflict) {
		t.Errorf("setup over existing ids: %v", err)
	}
	for _, n := range []int{0, MaxProducers + 1} {
		if _, err := Setup(ctx, s, SetupConfig{Tenant: "lt", Account: "la", Prefix: "q", Producers: n}); err == nil {
			t.Errorf("setup of %d producers accepted", n)
		}
	}

	path := filepath.Join(t.TempDir(), "creds.json")
	if err := WriteCreds(path, creds); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("credentials file mode: %v %v", fi.Mode(), err)
	}
	if err := WriteCreds(path, creds); !errors.Is(err, os.ErrExist) {
		t.Errorf("overwrote a credentials file: %v", err)
	}
	back, err := ReadCreds(path)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(back) != fmt.Sprint(creds) {
		t.Errorf("round trip\n got %+v\nwant %+v", back, creds)
	}
}

func TestReadCredsRefusals(t *testing.T) {
	dir := t.TempDir()
	good := Producer{Device: "d1", KeyID: "d1", Token: "tok", Seed: access.EncodeBase64URL(make([]byte, 32))}
	cases := map[string]any{
		"not json":     "{",
		"no producers": Creds{Tenant: "t"},
		"no tenant":    Creds{Producers: []Producer{good}},
		"bad seed":     Creds{Tenant: "t", Producers: []Producer{{Device: "d", KeyID: "d", Token: "tok", Seed: "AAAA"}}},
		"bad token":    Creds{Tenant: "t", Producers: []Producer{{Device: "d", KeyID: "d", Token: "a b", Seed: good.Seed}}},
		"no device":    Creds{Tenant: "t", Producers: []Producer{{KeyID: "d", Token: "tok", Seed: good.Seed}}},
	}
	for name, v := range cases {
		var b []byte
		if s, ok := v.(string); ok {
			b = []byte(s)
		} else {
			b, _ = json.Marshal(v)
		}
		p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadCreds(p); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 500, 0.99: 990, 0.999: 999, 1: 1000, 0: 1} {
		if got := Percentile(s, q); got != want*time.Millisecond {
			t.Errorf("p%v of 1..1000ms = %v, want %v", q, got, want*time.Millisecond)
		}
	}
	one := []time.Duration{7}
	if Percentile(one, 0.5) != 7 || Percentile(one, 0.999) != 7 {
		t.Error("one sample")
	}
	if Percentile(nil, 0.5) != 0 {
		t.Error("no samples")
	}
}

// ingestDouble checks what the generator sends the way ingest-api would at steps 1-3 and 5 (token to
// device, envelope structure, signature by that device's key, one stream per producer with sequences in
// order, unique events) and answers accepted; refuseSeq makes it refuse one sequence of every stream.
// It is not ingest-api: it exists to prove the generator's envelopes and accounting are right.
type ingestDouble struct {
	t         *testing.T
	creds     Creds
	refuseSeq int64

	mu       sync.Mutex
	next     map[string]int64 // device -> next expected sequence
	events   map[string]bool
	requests int
	reads    int // stream state reads (the producer module's Resume)
	problems []string
}

func newIngestDouble(t *testing.T, creds Creds) *ingestDouble {
	return &ingestDouble{t: t, creds: creds, next: map[string]int64{}, events: map[string]bool{}}
}

type itemAnswer struct {
	Outcome string `json:"outcome"`
	Reason  string `json:"reason,omitempty"`
	Cursor  int64  `json:"cursor,omitempty"`
	Status  int    `json:"status,omitempty"`
}

func (d *ingestDouble) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	d.mu.Lock()
	defer d.mu.Unlock()
	if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/streams/") {
		// The producer module's Resume: every stream of a run is new.
		d.reads++
		io.WriteString(w, `{"cursor":0,"replay_floor":0}`)
		return
	}
	d.requests++
	var device string
	var pub ed25519.PublicKey
	for _, p := range d.creds.Producers {
		if r.Header.Get("Authorization") == "Bearer "+p.Token {
			device = p.Device
			priv, _ := access.ParseSeed(p.Seed)
			pub = priv.Public().(ed25519.PublicKey)
		}
	}
	if device == "" {
		d.problems = append(d.problems, "unknown token")
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, `{"outcome":"refused","reason":"unauthenticated"}`)
		return
	}
	one := func(raw []byte) itemAnswer {
		e, err := envelope.Parse(raw)
		if err != nil {
			d.problems = append(d.problems, err.Error())
			return itemAnswer{Outcome: "refused", Reason: "invalid_envelope", Status: 400}
		}
		if e.Verify(pub) != nil || e.ProducerID != device || e.KeyID != device || e.TenantID != d.creds.Tenant {
			d.problems = append(d.problems, "bad signature or route for "+device)
			return itemAnswer{Outcome: "refused", Reason: "bad_signature", Status: 403}
		}
		if e.Validate(time.Now(), time.Hour) != nil {
			d.problems = append(d.problems, "step 4 refusal")
		}
		want := d.next[device] + 1
		if e.Sequence != want {
			d.problems = append(d.problems, fmt.Sprintf("%s: sequence %d, want %d", device, e.Sequence, want))
		}
		d.next[device] = e.Sequence
		if d.events[e.EventIdentity()] {
			d.problems = append(d.problems, "repeated event "+e.EventID)
		}
		d.events[e.EventIdentity()] = true
		if e.Sequence == d.refuseSeq {
			return itemAnswer{Outcome: "refused", Reason: "sequence_conflict", Status: 409}
		}
		return itemAnswer{Outcome: "accepted", Cursor: e.Sequence, Status: 200}
	}
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/v1/envelopes/batch" {
		items, err := envelope.SplitBatch(body)
		if err != nil {
			d.problems = append(d.problems, err.Error())
			w.WriteHeader(400)
			return
		}
		var out struct {
			Results []itemAnswer `json:"results"`
		}
		for _, it := range items {
			out.Results = append(out.Results, one(it))
		}
		json.NewEncoder(w).Encode(out)
		return
	}
	if r.URL.Path != "/v1/envelopes" {
		d.problems = append(d.problems, "path "+r.URL.Path)
	}
	a := one(body)
	status := a.Status
	a.Status = 0
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(a)
}

func testCreds(n int) Creds {
	c := Creds{Tenant: "lt", Account: "la"}
	for i := 1; i <= n; i++ {
		seed := bytes.Repeat([]byte{byte(i)}, 32)
		dev := fmt.Sprintf("dev-%d", i)
		c.Producers = append(c.Producers, Producer{Device: dev, KeyID: dev, Token: "tok-" + dev, Seed: access.EncodeBase64URL(seed)})
	}
	return c
}

func runAgainst(t *testing.T, d *ingestDouble, cfg Config) Report {
	t.Helper()
	srv := httptest.NewServer(d)
	defer srv.Close()
	u, err := access.CheckURL(srv.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg.URL = u
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	plan, err := NewPlan(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := plan.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(d.problems) > 0 {
		t.Fatalf("the generator sent wrong envelopes: %v", d.problems[:min(5, len(d.problems))])
	}
	return rep
}

func checkLatencies(t *testing.T, rep Report) {
	t.Helper()
	if !(rep.P50 > 0 && rep.P50 <= rep.P99 && rep.P99 <= rep.P999 && rep.P999 <= rep.Max) {
		t.Errorf("latencies out of order: %+v", rep)
	}
	if rep.Elapsed <= 0 || rep.Throughput <= 0 {
		t.Errorf("elapsed %v throughput %v", rep.Elapsed, rep.Throughput)
	}
}

func TestRunSingle(t *testing.T) {
	creds := testCreds(4)
	d := newIngestDouble(t, creds)
	rep := runAgainst(t, d, Config{Creds: creds, Producers: 4, Count: 103, PayloadBytes: 300})
	if !rep.OK() || rep.Requests != 103 || rep.Envelopes != 103 || rep.Accepted != 103 || rep.Statuses[200] != 103 ||
		rep.Route != "/v1/envelopes" || len(rep.Refused) != 0 {
		t.Errorf("report %+v", rep)
	}
	checkLatencies(t, rep)
	// 103 over 4 producers: 26, 26, 26, 25, each from sequence 1.
	for i, want := range []int64{26, 26, 26, 25} {
		if got := d.next[creds.Producers[i].Device]; got != want {
			t.Errorf("producer %d ended at sequence %d, want %d", i, got, want)
		}
	}
	if len(d.events) != 103 {
		t.Errorf("%d distinct events, want 103", len(d.events))
	}
	if !strings.Contains(rep.String(), "throughput") || !strings.Contains(rep.String(), "accepted 103") {
		t.Errorf("report text %q", rep.String())
	}
}

func TestRunBatchAtRate(t *testing.T) {
	creds := testCreds(3)
	d := newIngestDouble(t, creds)
	// A rate far above what the test can reach exercises the pacing path without timing anything.
	rep := runAgainst(t, d, Config{Creds: creds, Producers: 3, Count: 65, Batch: 10, Rate: 1e9, Duration: time.Hour})
	// 65 over 3: 22, 22, 21 -> 3 + 3 + 3 requests of at most 10.
	if !rep.OK() || rep.Requests != 9 || d.requests != 9 || rep.Envelopes != 65 || rep.Accepted != 65 ||
		rep.Route != "/v1/envelopes/batch" || rep.Batch != 10 {
		t.Errorf("report %+v (double saw %d requests)", rep, d.requests)
	}
	checkLatencies(t, rep)
}

func TestRunCountsRefusals(t *testing.T) {
	creds := testCreds(2)
	d := newIngestDouble(t, creds)
	d.refuseSeq = 3
	rep := runAgainst(t, d, Config{Creds: creds, Producers: 2, Count: 10})
	if rep.OK() || rep.Accepted != 8 || rep.Refused["sequence_conflict"] != 2 || rep.Statuses[409] != 2 || rep.Statuses[200] != 8 {
		t.Errorf("report %+v", rep)
	}
	if !strings.Contains(rep.String(), "refused: sequence_conflict=2") {
		t.Errorf("report text %q", rep.String())
	}

	d = newIngestDouble(t, creds)
	d.refuseSeq = 3
	rep = runAgainst(t, d, Config{Creds: creds, Producers: 2, Count: 10, Batch: 5})
	if rep.OK() || rep.Accepted != 8 || rep.Refused["sequence_conflict"] != 2 || rep.Statuses[200] != 2 {
		t.Errorf("batch report %+v", rep)
	}
}

// TestRunSDK runs the same plans through the producer module: the same envelopes reach the service,
// numbered from 1 per stream, and every answer is counted once per envelope.
func TestRunSDK(t *testing.T) {
	creds := testCreds(4)
	d := newIngestDouble(t, creds)
	rep := runAgainst(t, d, Config{Creds: creds, Producers: 4, Count: 103, PayloadBytes: 300, SDK: true})
	if !rep.OK() || rep.Requests != 103 || d.requests != 103 || rep.Accepted != 103 || rep.Statuses[200] != 103 ||
		rep.Route != "/v1/envelopes" || len(rep.Refused) != 0 || d.reads != 4 {
		t.Errorf("report %+v (double saw %d posts, %d stream reads)", rep, d.requests, d.reads)
	}
	checkLatencies(t, rep)
	for i, want := range []int64{26, 26, 26, 25} {
		if got := d.next[creds.Producers[i].Device]; got != want {
			t.Errorf("producer %d ended at sequence %d, want %d", i, got, want)
		}
	}
	if len(d.events) != 103 {
		t.Errorf("%d distinct events, want 103", len(d.events))
	}

	creds = testCreds(3)
	d = newIngestDouble(t, creds)
	rep = runAgainst(t, d, Config{Creds: creds, Producers: 3, Count: 65, Batch: 10, SDK: true})
	// 65 over 3: 22, 22, 21 -> 3 + 3 + 3 calls of at most 10.
	if !rep.OK() || rep.Requests != 9 || d.requests != 9 || rep.Accepted != 65 || rep.Statuses[200] != 65 || rep.Batch != 10 {
		t.Errorf("batch report %+v (double saw %d posts)", rep, d.requests)
	}

	// A refusal is an answer, counted by its reason; the module does not reuse a sequence the
	// service says is taken, and reads the stream again before the next send.
	creds = testCreds(2)
	d = newIngestDouble(t, creds)
	d.refuseSeq = 3
	rep = runAgainst(t, d, Config{Creds: creds, Producers: 2, Count: 10, SDK: true})
	if rep.OK() || rep.Accepted != 8 || rep.Refused["sequence_conflict"] != 2 || rep.Statuses[409] != 2 || rep.Statuses[200] != 8 || d.reads != 4 {
		t.Errorf("refusal report %+v (%d stream reads)", rep, d.reads)
	}
}

// TestRunSDKUnreachable: a service that is not there is a failed run before the clock starts, not a
// run of transport errors.
func TestRunSDKUnreachable(t *testing.T) {
	u, _ := access.CheckURL("http://127.0.0.1:1", true)
	plan, err := NewPlan(Config{URL: u, Creds: testCreds(1), Producers: 1, Count: 1, Timeout: 200 * time.Millisecond, SDK: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "resume") {
		t.Errorf("run against nothing: %v", err)
	}
}

func TestTallyRecord(t *testing.T) {
	tl := newTally()
	tl.record(200, []byte(`{"results":[{"outcome":"accepted"}]}`), 2, true, false)
	tl.record(503, []byte(`{"outcome":"refused","reason":"unavailable"}`), 5, true, false)
	tl.record(500, []byte(`{"outcome":"accepted"}`), 1, false, false)
	tl.record(502, []byte(`<html>`), 1, false, false)
	tl.record(200, []byte(`{"outcome":"duplicate"}`), 1, false, false)
	want := map[string]int{"batch_result_count_mismatch": 2, "unavailable": 5, "http_500_claims_accepted": 1, "http_502_unreadable_body": 1}
	if fmt.Sprint(tl.refused) != fmt.Sprint(want) || tl.accepted != 0 || tl.duplicates != 1 {
		t.Errorf("refused %v accepted %d duplicates %d", tl.refused, tl.accepted, tl.duplicates)
	}
}

func TestRunInterrupted(t *testing.T) {
	creds := testCreds(2)
	d := newIngestDouble(t, creds)
	srv := httptest.NewServer(d)
	defer srv.Close()
	u, _ := access.CheckURL(srv.URL, true)
	plan, err := NewPlan(Config{URL: u, Creds: creds, Producers: 2, Count: 4, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := plan.Run(ctx)
	if !errors.Is(err, context.Canceled) || rep.Requests != 0 || d.requests != 0 {
		t.Errorf("cancelled run: %+v, %v; double saw %d", rep, err, d.requests)
	}
}

func TestNewPlanRefusals(t *testing.T) {
	creds := testCreds(2)
	loop, _ := access.CheckURL("http://127.0.0.1:1", true)
	afar, _ := access.CheckURL("https://ingest.example.com", false)
	base := Config{URL: loop, Creds: creds, Producers: 2, Count: 10, Timeout: time.Second}
	cases := map[string]func(c *Config){
		"no url":            func(c *Config) { c.URL = nil },
		"not loopback":      func(c *Config) { c.URL = afar },
		"no producers":      func(c *Config) { c.Producers = 0 },
		"too many":          func(c *Config) { c.Producers = 3 },
		"count < producers": func(c *Config) { c.Count = 1 },
		"count too big":     func(c *Config) { c.Count = MaxCount + 1 },
		"batch 101":         func(c *Config) { c.Batch = 101 },
		"negative batch":    func(c *Config) { c.Batch = -1 },
		"negative rate":     func(c *Config) { c.Rate = -1 },
		"negative duration": func(c *Config) { c.Duration = -time.Second },
		"payload too big":   func(c *Config) { c.PayloadBytes = MaxPayloadBytes + 1 },
		"no timeout":        func(c *Config) { c.Timeout = 0 },
		"bad seed": func(c *Config) {
			c.Creds = Creds{Tenant: "lt", Producers: []Producer{{Device: "d", KeyID: "d", Token: "t", Seed: "AAAA"}}}
			c.Producers = 1
		},
		"bad identity": func(c *Config) { c.Project = "a b" },
		"sdk with outbox credentials": func(c *Config) {
			c.Creds = Creds{Tenant: "lt", Outbox: true, Project: "p", Topic: "t", Producers: creds.Producers}
			c.SDK = true
		},
		"bad key id for the sdk": func(c *Config) {
			c.Creds = Creds{Tenant: "lt", Producers: []Producer{{Device: "d", KeyID: "-bad", Token: "t", Seed: creds.Producers[0].Seed}}}
			c.Producers, c.SDK = 1, true
		},
	}
	for name, mod := range cases {
		cfg := base
		mod(&cfg)
		if _, err := NewPlan(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestMainCommandLine(t *testing.T) {
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb}
	ctx := context.Background()
	for _, args := range [][]string{{"-h"}, {"setup", "-h"}, {"run", "-h"}} {
		out.Reset()
		errb.Reset()
		if code := Main(ctx, args, env); code != ExitOK || !strings.Contains(out.String(), "Usage") || errb.Len() != 0 {
			t.Errorf("%v: code %d stdout %q stderr %q", args, code, out.String(), errb.String())
		}
	}
	dir := t.TempDir()
	credsPath := filepath.Join(dir, "creds.json")
	if err := WriteCreds(credsPath, testCreds(2)); err != nil {
		t.Fatal(err)
	}
	usage := []struct {
		args []string
		msg  string
	}{
		{nil, "Usage:"},
		{[]string{"bench"}, `unknown command "bench"`},
		{[]string{"setup"}, "--out is required"},
		{[]string{"setup", "--out", filepath.Join(dir, "x"), "--producers", "0"}, "--producers must be 1-4096"},
		{[]string{"setup", "--out", filepath.Join(dir, "x"), "--tenant", "a b"}, `--tenant "a b" makes invalid identities`},
		{[]string{"setup", "--out", filepath.Join(dir, "x")}, "DATABASE_URL is not set"},
		{[]string{"run"}, "--creds is required"},
		{[]string{"run", "--creds", credsPath, "--url", "https://ingest.example.com"}, "only loopback hosts"},
		{[]string{"run", "--creds", filepath.Join(dir, "none")}, "no such file"},
		{[]string{"run", "--creds", credsPath, "--producers", "3"}, "producers must be 1-2"},
		{[]string{"run", "--creds", credsPath, "--batch", "101"}, "batch must be 0"},
		{[]string{"run", "--creds", credsPath, "--project", "p/1"}, `--project "p/1" is not a valid identity`},
		{[]string{"run", "--creds", credsPath, "stray"}, `unexpected argument "stray"`},
	}
	for _, c := range usage {
		out.Reset()
		errb.Reset()
		if code := Main(ctx, c.args, env); code != ExitUsage || !strings.Contains(errb.String(), c.msg) {
			t.Errorf("%v: code %d stderr %q, want exit 2 mentioning %q", c.args, code, errb.String(), c.msg)
		}
	}

	// A full run through the command line, against the double, with the JSON report.
	d := newIngestDouble(t, testCreds(2))
	srv := httptest.NewServer(d)
	defer srv.Close()
	out.Reset()
	errb.Reset()
	code := Main(ctx, []string{"run", "--creds", credsPath, "--url", srv.URL, "--producers", "2", "--count", "20", "--batch", "4", "--json"}, env)
	if code != ExitOK {
		t.Fatalf("run: code %d stderr %q", code, errb.String())
	}
	var rep Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("JSON report %q: %v", out.String(), err)
	}
	if rep.Accepted != 20 || rep.Requests != 6 || rep.Producers != 2 || rep.Batch != 4 {
		t.Errorf("report %+v", rep)
	}
	if strings.Contains(out.String()+errb.String(), "tok-dev-1") {
		t.Error("the report shows a token")
	}

	// Refusals make the exit status 1 while still printing the report.
	d.mu.Lock()
	d.next, d.events, d.refuseSeq = map[string]int64{}, map[string]bool{}, 1
	d.mu.Unlock()
	out.Reset()
	errb.Reset()
	code = Main(ctx, []string{"run", "--creds", credsPath, "--url", srv.URL, "--producers", "2", "--count", "4"}, env)
	if code != ExitFailure || !strings.Contains(out.String(), "sequence_conflict=2") || !strings.Contains(errb.String(), "not every envelope was accepted") {
		t.Errorf("refusals: code %d stdout %q stderr %q", code, out.String(), errb.String())
	}
}

func TestMainSetup(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	var out, errb bytes.Buffer
	env := Env{Stdout: &out, Stderr: &errb, Getenv: func(k string) string {
		if k == "DATABASE_URL" {
			return dsn
		}
		return ""
	}}
	path := filepath.Join(t.TempDir(), "creds.json")
	if code := Main(context.Background(), []string{"setup", "--out", path, "--producers", "2"}, env); code != ExitOK {
		t.Fatalf("setup: code %d stderr %q", code, errb.String())
	}
	creds, err := ReadCreds(path)
	if err != nil || len(creds.Producers) != 2 || creds.Tenant != "loadgen" {
		t.Fatalf("creds %+v, %v", creds, err)
	}
	if strings.Contains(out.String(), creds.Producers[0].Token) {
		t.Error("setup printed a token")
	}
	// A second setup on the same database works: the default prefix is random.
	path2 := filepath.Join(t.TempDir(), "creds.json")
	if code := Main(context.Background(), []string{"setup", "--out", path2, "--producers", "1"}, env); code != ExitOK {
		t.Fatalf("second setup: code %d stderr %q", code, errb.String())
	}
	// The file is never overwritten.
	errb.Reset()
	if code := Main(context.Background(), []string{"setup", "--out", path, "--producers", "1"}, env); code != ExitUsage || !strings.Contains(errb.String(), "exists") {
		t.Errorf("overwrite: code %d stderr %q", code, errb.String())
	}
}

func TestTallyRecordOutbox(t *testing.T) {
	tl := newTally()
	tl.record(201, []byte(`{"envelope":{},"message_ids":[]}`), 1, false, true)
	tl.record(200, []byte(`{"envelope":{},"message_ids":[]}`), 1, false, true)
	tl.record(422, []byte(`{"outcome":"refused","reason":"no_endpoint"}`), 1, false, true)
	tl.record(200, []byte(`{"results":[{"envelope":{},"status":201},{"outcome":"refused","reason":"rate_limited","status":429}]}`), 2, true, true)
	tl.record(503, []byte(`{"outcome":"refused","reason":"unavailable"}`), 3, true, true)
	want := map[string]int{"no_endpoint": 1, "rate_limited": 1, "unavailable": 3}
	if fmt.Sprint(tl.refused) != fmt.Sprint(want) || tl.accepted != 2 || tl.duplicates != 1 {
		t.Errorf("refused %v accepted %d duplicates %d", tl.refused, tl.accepted, tl.duplicates)
	}
}

// An outbox plan sends POST /v1/outbox bodies of the file's project and topic, each with a key of its
// own; with SameCredential every client uses the first credential.
func TestNewOutboxPlan(t *testing.T) {
	creds := Creds{Tenant: "lt", Account: "la", Outbox: true, Project: "lp", Topic: "lg.topic",
		Producers: []Producer{{Device: "svc-1", Token: "tok-1"}, {Device: "svc-2", Token: "tok-2"}}}
	u, _ := access.CheckURL("http://127.0.0.1:1", true)
	for _, batch := range []int{0, 3} {
		p, err := NewPlan(Config{URL: u, Creds: creds, Producers: 2, Count: 7, Batch: batch, Timeout: time.Second, SameCredential: true})
		if err != nil {
			t.Fatal(err)
		}
		if p.clients[0] != "tok-1" || p.clients[1] != "tok-1" || !p.outbox {
			t.Fatalf("clients %v", p.clients)
		}
		keys := map[string]bool{}
		for _, reqs := range p.work {
			for _, r := range reqs {
				items := [][]byte{r.body}
				if batch > 0 {
					var err error
					if items, err = envelope.SplitOutboxBatch(r.body); err != nil || len(items) != r.n {
						t.Fatalf("batch body %s: %v", r.body, err)
					}
				}
				for _, it := range items {
					var m map[string]any
					if err := json.Unmarshal(it, &m); err != nil || m["project_id"] != "lp" || m["topic"] != "lg.topic" {
						t.Fatalf("body %s", it)
					}
					keys[m["idempotency_key"].(string)] = true
				}
			}
		}
		if len(keys) != 7 || (batch == 0) != (p.route == "/v1/outbox") {
			t.Fatalf("batch %d: %d keys, route %s", batch, len(keys), p.route)
		}
	}
	if _, err := NewPlan(Config{URL: u, Creds: testCreds(2), Producers: 2, Count: 2, Timeout: time.Second, SameCredential: true}); err == nil {
		t.Fatal("same-credential accepted for device credentials")
	}
}
