package chaos

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Toxiproxy v2.5.0: a toxic added to a link that is closing at that moment (its connection
		// ended) leaves the new stub's goroutine blocked on a send nobody receives. A leak inside the
		// library, a handful over hundreds of faults in the long run; our own goroutines stay checked.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"))
}

// defaultDuration is the fault time of the default run, over all scenarios; CHAOS_DURATION (a Go
// duration) sets it for a longer run (make chaos).
const defaultDuration = 45 * time.Second

func chaosDuration(t *testing.T) time.Duration {
	v := os.Getenv("CHAOS_DURATION")
	if v == "" {
		return defaultDuration
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Second || d > 2*time.Hour {
		t.Fatalf("CHAOS_DURATION=%q: want a Go duration between 10s and 2h", v)
	}
	return d
}

// TestChaos runs every scenario against freshly built binaries on a throwaway PostgreSQL cluster and
// fails on any violation. Each scenario gets its Weight's share of CHAOS_DURATION.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("fault injection runs for a minute or more; skipped in -short mode")
	}
	total := chaosDuration(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), total+10*time.Minute)
	defer cancel()

	cluster := startCluster(ctx, t)
	root := repoRoot(t)
	work := t.TempDir()
	bins, err := Build(ctx, root, work)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built binaries and started PostgreSQL on %s in %v", cluster.Addr(), time.Since(began).Round(time.Second))

	durations := ScenarioDurations(total, Scenarios)
	var reports []Report
	for i, sc := range Scenarios {
		d := durations[i]
		t.Run(sc.Name, func(t *testing.T) {
			rep, err := RunScenario(ctx, Config{
				Bins: bins, Cluster: cluster, WorkDir: work, Duration: d,
				Rate: 150, OutboxRate: 80, OutboxClients: 8, IngestReplicas: 2, WorkerReplicas: 3, Logf: t.Logf,
			}, sc)
			t.Log(rep.String())
			if err != nil {
				t.Fatalf("harness: %v", err)
			}
			for _, v := range rep.Violations() {
				t.Errorf("violation %s", v)
			}
			reports = append(reports, rep)
		})
	}
	t.Log(summary(reports, time.Since(began)))
}

// startCluster starts a throwaway PostgreSQL cluster that the test stops and removes at its end.
func startCluster(ctx context.Context, t *testing.T) *Cluster {
	t.Helper()
	cluster, err := StartCluster(ctx)
	if errors.Is(err, ErrNoServerBinaries) {
		t.Fatalf("%v (the test restarts a PostgreSQL of its own and cannot use a shared server)", err)
	}
	if err != nil {
		t.Fatalf("start a throwaway PostgreSQL cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	return cluster
}

// repoRoot is the repository's root directory, where the binaries are built from.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// summary is the figures of the whole run, in the form docs/reliability.md quotes.
func summary(reports []Report, elapsed time.Duration) string {
	faults := map[string]int{}
	var requests, violations, envelopes, acked, messages, delivered, dead, sinkReqs int
	var b strings.Builder
	for _, r := range reports {
		requests += r.Requests
		violations += len(r.Violations())
		envelopes += r.Check.Envelopes
		acked += r.Check.Acknowledged
		messages += r.Check.Messages
		delivered += r.Check.Delivered
		dead += r.Check.Dead
		sinkReqs += r.Check.SinkRequests
		for k, n := range r.Faults {
			faults[k] += n
		}
		fmt.Fprintf(&b, "| %s | %v | %d | %d | %d/%d | %d/%d/%d | %d | %d |\n", r.Scenario, r.Elapsed.Round(time.Second),
			r.Requests, r.FaultTotal(), r.Check.Acknowledged, r.Check.Envelopes, r.Check.Delivered, r.Check.Dead,
			r.Check.Messages, r.Check.SinkRequests, len(r.Violations()))
	}
	kinds := make([]string, 0, len(faults))
	for k := range faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var fs []string
	total := 0
	for _, k := range kinds {
		fs = append(fs, fmt.Sprintf("%s %d", k, faults[k]))
		total += faults[k]
	}
	return fmt.Sprintf("chaos total (%v): requests=%d envelopes=%d acknowledged=%d messages=%d delivered=%d dead=%d "+
		"sink_requests=%d faults=%d (%s) violations=%d\n"+
		"| scenario | time | requests | faults | acknowledged/envelopes | delivered/dead/messages | sink requests | violations |\n"+
		"|---|---|---|---|---|---|---|---|\n%s",
		elapsed.Round(time.Second), requests, envelopes, acked, messages, delivered, dead, sinkReqs, total,
		strings.Join(fs, ", "), violations, b.String())
}

// TestCheckerCatchesViolations feeds the checker a consistent state (no violation) and then a broken
// one, and wants every break named.
func TestCheckerCatchesViolations(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.NewDatabase(t)
	st := storetest.Open(t, dsn)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	actor := store.Actor{TenantID: tenant, AccountID: "acct", DeviceID: "dev-01", CorrelationID: "c-1"}
	ledger := newLedger()
	ingest := func(seq int64, commit bool) *SentEnvelope {
		e, err := envelope.Sign(envelope.Draft{TenantID: tenant, ProjectID: project, ProducerID: "dev-01",
			EventID: fmt.Sprintf("e-%d", seq), IdempotencyKey: fmt.Sprintf("k-%d", seq), KeyID: "dev-01",
			Sequence: seq, IssuedAt: time.Now().UTC().Truncate(time.Millisecond),
			Metadata: envelope.Metadata{Kind: "chaos.sample"}, Payload: []byte(`{"n":1}`)}, priv)
		if err != nil {
			t.Fatal(err)
		}
		s := &SentEnvelope{Producer: "dev-01", Project: project, Sequence: seq, EventIdentity: e.EventIdentity(),
			ContentDigest: e.ContentDigest(), Canonical: e.Canonical(), Outcome: "accepted", Acks: 1, MaxCursor: seq}
		if commit {
			r, err := st.Inbound().Ingest(ctx, actor, store.IngestInput{ProjectID: project, ProducerID: "dev-01",
				EventIdentity: e.EventIdentity(), KeyID: "dev-01", IdempotencyDigest: e.IdempotencyDigest(),
				ContentDigest: e.ContentDigest(), Sequence: seq, IssuedAt: time.Now(), Canonical: e.Canonical(),
				ExpiresAt: time.Now().Add(time.Hour)})
			if err != nil || r.Outcome != store.OutcomeAccepted {
				t.Fatalf("ingest %d: %+v %v", seq, r, err)
			}
		}
		return s
	}
	ledger.Envelopes = append(ledger.Envelopes, ingest(1, true), ingest(2, true))

	if _, err := st.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: tenant, ProjectID: project, Topic: topic,
		URL: "http://127.0.0.1:9/a", SecretRef: "chaos-hook"}); err != nil {
		t.Fatal(err)
	}
	enqueue := func(key string) *SentOutbox {
		res, err := st.Outbox().Enqueue(ctx, store.Actor{TenantID: tenant, AccountID: "acct", DeviceID: "svc-1", CorrelationID: "c-" + key},
			store.EnqueueRequest{ProjectID: project, ProducerID: "svc-1", Topic: topic,
				IdempotencyDigest: sha256.Sum256([]byte(key)), RequestDigest: sha256.Sum256([]byte("req " + key)), MaxAttempts: 5,
				Build: func(seq int64) ([]byte, string, error) {
					return fmt.Appendf(nil, `{"idempotency_key":%q,"sequence":%d}`, key, seq),
						envelope.EventIdentity(tenant, project, key), nil
				}})
		if err != nil || len(res.MessageIDs) != 1 {
			t.Fatalf("enqueue %s: %v", key, err)
		}
		return &SentOutbox{Key: key, MessageIDs: res.MessageIDs, Envelope: res.Envelope, Answers: 1}
	}
	delivered := enqueue("ob-1")
	ledger.Outbox = append(ledger.Outbox, delivered)
	id := delivered.MessageIDs[0]
	before := time.Now()
	claimed, err := st.Outbox().Claim(ctx, tenant, 10, time.Minute)
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %d", err, len(claimed))
	}
	receipts := map[string][]Receipt{id: {{MessageID: id, Arrived: before, Finished: before, Answer: "204"}}}
	if err := st.Outbox().MarkDelivered(ctx, tenant, id, claimed[0].Attempt); err != nil {
		t.Fatal(err)
	}

	res, err := Check(ctx, db, tenant, ledger, receipts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Violations) != 0 || res.Acknowledged != 2 || res.Identities != 2 || res.Delivered != 1 {
		t.Fatalf("consistent state: %+v", res)
	}

	// Now break it.
	if _, err := db.ExecContext(ctx, `DELETE FROM inbound_payloads WHERE tenant_id = $1 AND event_identity = decode($2, 'hex')`,
		tenant, ledger.Envelopes[0].EventIdentity); err != nil {
		t.Fatal(err)
	}
	ledger.Envelopes = append(ledger.Envelopes, ingest(3, false)) // "accepted", never stored
	ledger.Envelopes[1].Twice = true                              // a resend answered accepted
	lost := enqueue("ob-2")                                       // answered, never delivered
	ledger.Outbox = append(ledger.Outbox, lost, &SentOutbox{Key: "ob-3", MessageIDs: []string{"msg_000000000000000000000000"}, Answers: 1})
	if _, err := db.ExecContext(ctx, `UPDATE outbox_messages SET attempts = 0 WHERE message_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE outbound_streams SET last_sequence = last_sequence + 1 WHERE tenant_id = $1`, tenant); err != nil {
		t.Fatal(err) // a sequence no envelope holds
	}
	ledger.Bad5xx = append(ledger.Bad5xx, `ingest 503 "{\"outcome\":\"accepted\"}"`)
	ledger.clientError("device-1 stream read answered 401 unauthenticated")
	late := time.Now().Add(time.Second)
	receipts[id] = append(receipts[id], Receipt{MessageID: id, Arrived: late, Finished: late, Answer: "500"})
	receipts["msg_ffffffffffffffffffffffff"] = []Receipt{{MessageID: "msg_ffffffffffffffffffffffff", Arrived: late, Answer: "refused:401"}}

	res, err = Check(ctx, db, tenant, ledger, receipts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, v := range res.Violations {
		got[v.Check]++
		t.Logf("found %s", v)
	}
	for _, want := range []string{
		"verify_attempts_inconsistent", // envctl verify's own check: delivered with attempts 0
		"more_requests_than_attempts",  // two requests, attempts 0
		"cursor_behind_acknowledged",
		"acknowledged_payload_differs",     // payload of an acknowledged envelope deleted
		"half_written_envelope",            // identity without payload
		"acknowledged_not_retained",        // "accepted" told, nothing stored
		"cursor_went_back",                 // an answer's cursor 3 above the stream's 2
		"message_lost",                     // still pending after the drain
		"enqueued_message_missing",         // an id a client got that the database lacks
		"settled_by_stale_attempt",         // a request after the settlement, and a last answer not 2xx
		"unknown_delivery", "bad_delivery", // a request for no message, refused by the verifier
		"bad_5xx_answer",        // a 5xx that said accepted
		"accepted_twice",        // a resend answered accepted
		"client_stopped",        // a device whose producer gave up before the run's end
		"outbound_sequence_gap", // a stream past its envelopes
	} {
		if got[want] == 0 {
			t.Errorf("checker missed %s; found %v", want, got)
		}
	}
}
