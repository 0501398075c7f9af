package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// chainTopic is the topic the relay enqueues every ingested event under.
const chainTopic = "ingested"

// TestChainEveryEffectOnceWithBothSidesKilled runs the whole chain on real
// binaries: a producer process (modules/producer, FileStore) → ingest-api →
// a relay that reads the device's stream with a service credential and
// enqueues one outbox message per event → delivery-worker → a receiver
// process (modules/receiver, pgreceipts) whose effect is a row insert. The
// producer is SIGKILLed between a send and its answer (three times, then
// restarted with Resume), and the receiver SIGKILLs itself between its
// effect's commit and its answer (every third outbound sequence). Every
// event's effect must exist exactly once, and the inbound stream and the
// outbound sequence must both be contiguous.
func TestChainEveryEffectOnceWithBothSidesKilled(t *testing.T) {
	const events, crashEvery = crashEvents, 3
	r := newUpgradeRig(t) // tenant "up": its outbound signing key and webhook secret
	rxDSN := storetest.NewDatabase(t)
	token, seed := setUpCrashDevice(t, r.dsn, "up")
	res := envctlRun(t, r.dsn, "credential", "issue", "--tenant", "up", "--account", "acct-1", "--device", "relay-1", "--role", "service")
	if res.code != 0 {
		t.Fatalf("credential issue: %+v", res)
	}
	svc := strings.TrimSpace(res.stdout)
	rxAddr := freeAddr(t)
	if res := envctlRun(t, r.dsn, "endpoint", "add", "--tenant", "up", "--project", crashProject, "--topic", chainTopic,
		"--url", "http://"+rxAddr+"/hook", "--secret-ref", "ep"); res.code != 0 {
		t.Fatalf("endpoint add: %+v", res)
	}
	startService(t, "ingest-api", r.ingestEnv, r.ingestURL+"/readyz")
	startService(t, "delivery-worker", append(r.workEnv, "DELIVERY_BACKOFF_BASE=50ms", "DELIVERY_BACKOFF_MAX=500ms",
		"DELIVERY_HTTP_TIMEOUT=5s"), r.workURL+"/readyz")
	rx := startReceiver(t, []string{"RX_ADDR=" + rxAddr, "RX_DSN=" + rxDSN, "RX_SECRET=" + r.whSecret,
		"RX_KEYS_URL=" + r.ingestURL, "RX_TOKEN=" + svc, fmt.Sprintf("RX_CRASH_EVERY=%d", crashEvery)})

	// The relay runs while the producer is being killed, as a consumer of
	// the stream would; it ends once it enqueued every event.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	relayed := make(chan error, 1)
	go func() { relayed <- relay(ctx, r.ingestURL, svc, events) }()

	runKilledProducer(t, r.ingestURL, "up", token, seed, filepath.Join(r.dir, "producer-state.json"), events, []int64{3, 1, 4, 0})
	if err := <-relayed; err != nil {
		t.Fatalf("relay: %v", err)
	}

	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var delivered, dead, all int
		if err := r.admin.QueryRow(`SELECT count(*) FILTER (WHERE status = 'delivered'), count(*) FILTER (WHERE status = 'dead'),
			count(*) FROM outbox_messages WHERE tenant_id = 'up'`).Scan(&delivered, &dead, &all); err != nil {
			t.Fatal(err)
		}
		if dead > 0 || all != events {
			t.Fatalf("%d messages, %d dead; want %d, none dead\nreceiver: %s", all, dead, events, rx.logs.String())
		}
		if delivered == events {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered after 60s\nreceiver: %s", delivered, events, rx.logs.String())
		}
	}

	// Inbound: every event once, sequences 1..events, cursor at the top.
	checkProducerStream(t, storetest.Open(t, r.dsn), "up", events)

	// Outbound: the relay's stream took sequences 1..events, one per event.
	var outSeqs string
	if err := r.admin.QueryRow(`SELECT string_agg(sequence::text, ',' ORDER BY sequence) FROM outbound_envelopes WHERE tenant_id = 'up'`).Scan(&outSeqs); err != nil {
		t.Fatal(err)
	}
	var oneTo []string
	for i := 1; i <= events; i++ {
		oneTo = append(oneTo, strconv.Itoa(i))
	}
	if outSeqs != strings.Join(oneTo, ",") {
		t.Fatalf("outbound sequences %s: not 1..%d", outSeqs, events)
	}

	// Effects: one row per event, none twice, each from its own message.
	rxCtx := context.Background()
	conn, err := pgx.Connect(rxCtx, rxDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(rxCtx)
	rows, err := conn.Query(rxCtx, `SELECT payload->>'event_id', count(*), count(DISTINCT webhook_id) FROM rx_effects GROUP BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	effects := map[string]int{}
	for rows.Next() {
		var ev string
		var n, hooks int
		if err := rows.Scan(&ev, &n, &hooks); err != nil {
			t.Fatal(err)
		}
		if n != 1 || hooks != 1 {
			t.Errorf("event %s took effect %d times (%d webhook ids)", ev, n, hooks)
		}
		effects[ev] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= events; i++ {
		if effects[crashEvent(i).EventID] == 0 {
			t.Errorf("event %s never took effect", crashEvent(i).EventID)
		}
	}
	if len(effects) != events {
		t.Errorf("effects of %d distinct events, want %d", len(effects), events)
	}
	var rxSeqs []int64
	if err := conn.QueryRow(rxCtx, `SELECT array_agg(sequence ORDER BY sequence) FROM rx_effects`).Scan(&rxSeqs); err != nil {
		t.Fatal(err)
	}
	if !isOneTo(rxSeqs, events) {
		t.Errorf("effects' outbound sequences %v: not 1..%d", rxSeqs, events)
	}
	restarts := rx.checkRestarts(t, events, crashEvery)
	t.Logf("%d events: producer killed 3 times between send and answer, receiver %d times between effect and answer; every effect once", events, restarts)
}

func isOneTo(seqs []int64, n int) bool {
	if len(seqs) != n {
		return false
	}
	for i, s := range seqs {
		if s != int64(i+1) {
			return false
		}
	}
	return true
}

// relay is the test's consumer of the crash producer's stream: it pages
// through GET …/envelopes with a service credential and enqueues one
// outbox message per event, keyed by the event id, so a repeated enqueue
// is the same message. It returns once it enqueued want events, or with
// an error when ctx ends first.
func relay(ctx context.Context, base, token string, want int64) error {
	client := &http.Client{Timeout: 5 * time.Second}
	var after int64
	var last string
	for after < want {
		var page wire.StreamPage
		status, err := relayCall(ctx, client, http.MethodGet,
			base+wire.StreamEnvelopesPath(crashProject, crashDevice)+"?after="+strconv.FormatInt(after, 10), token, nil, &page)
		if err == nil && status != http.StatusOK {
			err = fmt.Errorf("stream read answered %d", status)
		}
		for _, e := range page.Envelopes {
			if err != nil {
				break
			}
			if e.PayloadExpired {
				return fmt.Errorf("sequence %d expired", e.Sequence)
			}
			var env *envelope.Envelope
			if env, err = envelope.Parse(e.Envelope); err != nil {
				return fmt.Errorf("sequence %d: %w", e.Sequence, err)
			}
			payload, _ := json.Marshal(map[string]any{"event_id": env.EventID, "sequence": e.Sequence})
			body, _ := json.Marshal(wire.EnqueueRequest{ProjectID: crashProject, Topic: chainTopic,
				IdempotencyKey: "in-" + env.EventID, Kind: "ingested", Payload: payload, MaxAttempts: 50})
			var enq wire.Enqueued
			if status, err = relayCall(ctx, client, http.MethodPost, base+wire.RouteOutbox, token, body, &enq); err != nil {
				break
			}
			if status != http.StatusCreated && status != http.StatusOK || len(enq.MessageIDs) != 1 {
				return fmt.Errorf("enqueue of sequence %d answered %d with %d message ids", e.Sequence, status, len(enq.MessageIDs))
			}
			after = e.Sequence
		}
		if err != nil {
			last = err.Error()
		}
		if after >= want {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("relayed %d of %d events before the deadline (last error: %s)", after, want, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// relayCall makes one request and decodes a 2xx answer into out.
func relayCall(ctx context.Context, client *http.Client, method, url, token string, body []byte, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("answer %d: %w", resp.StatusCode, err)
		}
	}
	return resp.StatusCode, nil
}
