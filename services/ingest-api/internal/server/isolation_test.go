package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// isolationIDs are the identifiers a probe puts in its request: those of
// tenant-b's real data, or look-alikes that exist nowhere.
type isolationIDs struct {
	tenant, project, project2, producer string
	event, idem, key                    string
	topic, outKey                       string
	pending, dead, cursor               string
	keyPriv                             ed25519.PrivateKey // signs envelopes naming key
}

func randomMessageID(t testing.TB) string {
	t.Helper()
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "msg_" + hex.EncodeToString(b)
}

// normalized is an answer with what differs between any two requests
// removed: the correlation id (random per request) and event identities
// (derived from the request's own ids, so they differ with the ids).
func normalized(t testing.TB, r resp) string {
	t.Helper()
	var v any
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("answer %d %q: %v", r.status, r.body, err)
	}
	var walk func(any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			delete(v, "correlation_id")
			for k, x := range v {
				if k == "event_identity" {
					v[k] = "<event identity>"
				} else {
					v[k] = walk(x)
				}
			}
		case []any:
			for i := range v {
				v[i] = walk(v[i])
			}
		}
		return v
	}
	b, _ := json.Marshal(walk(v))
	return fmt.Sprintf("%d %s retry-after=%q type=%q", r.status, b, r.header.Get("Retry-After"), r.header.Get("Content-Type"))
}

// TestTenantIsolationEveryRoute: for every /v1/ route of the server and every
// role (device, service, operator), a tenant-a credential sent with tenant-b's
// ids gets exactly the answer it gets for ids that exist nowhere — status,
// body (but for the correlation id and the event identity the request's own
// ids determine) and headers — and tenant-b's rows are untouched afterwards.
// tenant-b's data is built to be reachable if the tenant were not applied:
// the same device id as tenant-a's device, streams with envelopes, a gap and
// a replay floor, an outbound key, an endpoint, pending and dead messages,
// and a key whose private half signs the probe that names it.
func TestTenantIsolationEveryRoute(t *testing.T) {
	o := newOutboxFixture(t)
	ctx := context.Background()
	const tenantB = "tenant-b"

	// tenant-b's data.
	outSeedB, outPubB := newSeed(5)
	writeKeysFile(t, o.keysPath, map[string][2]string{
		tenantA: {outKeyID, base64.RawURLEncoding.EncodeToString(o.seed)},
		tenantB: {"b-key", base64.RawURLEncoding.EncodeToString(outSeedB)},
	})
	if changed, err := o.keys.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v %v", changed, err)
	}
	inSeedB, pubB := newSeed(9)
	privB := ed25519.NewKeyFromSeed(inSeedB)
	if err := o.st.Credentials().AddKey(ctx, tenantB, "kb-1", pubB); err != nil {
		t.Fatal(err)
	}
	devB := o.issue(tenantB, "acct-1", deviceA, store.RoleDevice)
	devB2 := o.issue(tenantB, "acct-1", "device-b", store.RoleDevice)
	svcB := o.issue(tenantB, "acct-1", "svc-1", store.RoleService)
	opsB := o.issue(tenantB, "acct-1", "ops-1", store.RoleOperator)
	draftB := func(project, producer, event string, seq int64) envelope.Draft {
		return envelope.Draft{TenantID: tenantB, ProjectID: project, ProducerID: producer, EventID: event,
			IdempotencyKey: "idem-" + strings.TrimPrefix(event, "evt-"), KeyID: "kb-1", Sequence: seq,
			IssuedAt: testNow.Add(-time.Minute), Metadata: envelope.Metadata{Kind: "task.status"},
			Payload: []byte(`{"b":true}`)}
	}
	for _, seq := range []int64{1, 2, 3, 5} {
		wantAnswer(t, o.post(devB, signWith(t, privB, draftB("proj-b", deviceA, fmt.Sprintf("evt-b-%d", seq), seq))), 200, "accepted", "", -1)
	}
	for seq := int64(1); seq <= 2; seq++ {
		wantAnswer(t, o.post(devB2, signWith(t, privB, draftB("proj-b", "device-b", fmt.Sprintf("evt-bb-%d", seq), seq))), 200, "accepted", "", seq)
	}
	if _, err := o.st.Inbound().SetReplayFloor(ctx, tenantB, "proj-b2", deviceA, 4); err != nil {
		t.Fatal(err)
	}
	o.addEndpoint(tenantB, "proj-b", "task.b")
	var msgsB []string
	for i := 1; i <= 3; i++ {
		body := fmt.Sprintf(`{"project_id":"proj-b","topic":"task.b","idempotency_key":"out-b-%d","kind":"proposal","payload":{}}`, i)
		a, _ := o.enqueued(o.postOutbox(svcB, []byte(body)), http.StatusCreated, outPubB)
		msgsB = append(msgsB, a.MessageIDs...)
	}
	kill(t, o.fixture, tenantB, msgsB[0], msgsB[1]) // two dead, the third pending (retry in an hour)
	page := o.get(opsB, "/v1/dead-letters?project_id=proj-b&limit=1")
	var dl wire.DeadLetterPage
	decodeStrict(t, page.body, &dl)
	if page.status != 200 || len(dl.DeadLetters) != 1 || dl.NextAfter == nil {
		t.Fatalf("tenant-b's dead letters: %d %s", page.status, page.body)
	}
	// tenant-a has dead letters of its own in proj-1, dead after tenant-b's,
	// so a tenant-b cursor used on proj-1 has rows after it.
	a, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-iso", "")), http.StatusCreated, o.pub)
	kill(t, o.fixture, tenantA, a.MessageIDs...)

	// A look-alike cursor: tenant-b's position, a message id that exists nowhere.
	raw, err := base64.RawURLEncoding.DecodeString(*dl.NextAfter)
	if err != nil {
		t.Fatal(err)
	}
	micros, _, _ := strings.Cut(string(raw), ".")
	b := isolationIDs{tenant: tenantB, project: "proj-b", project2: "proj-b2", producer: "device-b",
		event: "evt-b-1", idem: "idem-b-1", key: "kb-1", topic: "task.b", outKey: "out-b-1",
		pending: msgsB[2], dead: msgsB[0], cursor: *dl.NextAfter, keyPriv: privB}
	_, noneKey, _ := ed25519.GenerateKey(rand.Reader)
	none := isolationIDs{tenant: "tenant-none", project: "proj-none", project2: "proj-none2", producer: "device-none",
		event: "evt-none-1", idem: "idem-none-1", key: "k-none", topic: "task.none", outKey: "out-none-1",
		pending: randomMessageID(t), dead: randomMessageID(t), keyPriv: noneKey}
	none.cursor = base64.RawURLEncoding.EncodeToString([]byte(micros + "." + randomMessageID(t)))

	snapshot := func() string {
		t.Helper()
		var b strings.Builder
		for _, q := range []string{
			`SELECT project_id || '/' || producer_id || ' ' || cursor || ' ' || replay_floor FROM streams WHERE tenant_id = $1 ORDER BY 1`,
			`SELECT encode(event_identity, 'hex') || ' ' || sequence FROM event_identities WHERE tenant_id = $1 ORDER BY 1`,
			`SELECT count(*)::text FROM inbound_payloads WHERE tenant_id = $1`,
			`SELECT count(*)::text FROM audit_events WHERE tenant_id = $1`,
			`SELECT message_id || ' ' || status || ' ' || attempts || ' ' || max_attempts || ' ' || replays || ' ' || last_error_code FROM outbox_messages WHERE tenant_id = $1 ORDER BY 1`,
			`SELECT count(*)::text FROM outbound_envelopes WHERE tenant_id = $1`,
			`SELECT project_id || '/' || producer_id || ' ' || last_sequence FROM outbound_streams WHERE tenant_id = $1 ORDER BY 1`,
			`SELECT endpoint_id || ' ' || state FROM endpoints WHERE tenant_id = $1 ORDER BY 1`,
			`SELECT key_id || ' ' || state FROM producer_keys WHERE tenant_id = $1 ORDER BY 1`,
		} {
			rows, err := o.admin.QueryContext(ctx, q, tenantB)
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var s string
				if err := rows.Scan(&s); err != nil {
					t.Fatal(err)
				}
				b.WriteString(s + "\n")
			}
			rows.Close()
			b.WriteString("--\n")
		}
		return b.String()
	}
	before := snapshot()

	sign := func(d envelope.Draft, priv ed25519.PrivateKey) []byte { return signWith(t, priv, d) }
	inA := func(ids isolationIDs, project, event string, seq int64) envelope.Draft {
		d := draft(seq)
		d.ProjectID, d.EventID, d.IdempotencyKey = project, event, ids.idem
		return d
	}
	type probe struct {
		name string
		req  func(ids isolationIDs) req
	}
	get := func(path string) req { return req{method: http.MethodGet, path: path} }
	post := func(path string, body []byte) req { return req{method: http.MethodPost, path: path, body: body} }
	// Reads come first: the writes below add tenant-a rows under the probed
	// names (the same for both id sets), which later reads would then see.
	probes := []probe{
		{"GET stream state", func(ids isolationIDs) req { return get("/v1/streams/" + ids.project + "/" + deviceA) }},
		{"GET stream state, floored", func(ids isolationIDs) req { return get("/v1/streams/" + ids.project2 + "/" + deviceA) }},
		{"GET stream envelopes", func(ids isolationIDs) req { return get("/v1/streams/" + ids.project + "/" + deviceA + "/envelopes") }},
		{"GET stream envelopes, other producer", func(ids isolationIDs) req {
			return get("/v1/streams/" + ids.project + "/" + ids.producer + "/envelopes?after=0&limit=100")
		}},
		{"GET outbox pending message", func(ids isolationIDs) req { return get("/v1/outbox/" + ids.pending) }},
		{"GET outbox dead message", func(ids isolationIDs) req { return get("/v1/outbox/" + ids.dead) }},
		{"GET dead letters", func(ids isolationIDs) req { return get("/v1/dead-letters?project_id=" + ids.project) }},
		{"GET dead letters after a cursor", func(ids isolationIDs) req {
			return get("/v1/dead-letters?project_id=" + ids.project + "&after=" + url.QueryEscape(ids.cursor))
		}},
		{"GET own dead letters after the cursor", func(ids isolationIDs) req {
			return get("/v1/dead-letters?project_id=proj-1&after=" + url.QueryEscape(ids.cursor))
		}},
		{"POST replay of a dead message", func(ids isolationIDs) req { return post("/v1/dead-letters/"+ids.dead+"/replay", nil) }},
		{"POST replay of a pending message", func(ids isolationIDs) req {
			return post("/v1/dead-letters/"+ids.pending+"/replay", nil)
		}},
		{"POST outbox to the other tenant's topic and key", func(ids isolationIDs) req {
			return post("/v1/outbox", []byte(`{"project_id":"`+ids.project+`","topic":"`+ids.topic+`","idempotency_key":"`+ids.outKey+`","kind":"proposal","payload":{}}`))
		}},
		{"POST envelope naming the other tenant", func(ids isolationIDs) req {
			d := inA(ids, ids.project, ids.event, 1)
			d.TenantID, d.KeyID = ids.tenant, ids.key
			return post("/v1/envelopes", sign(d, ids.keyPriv))
		}},
		{"POST envelope with the other tenant's key id, signed by that key", func(ids isolationIDs) req {
			d := inA(ids, ids.project2, ids.event+"-k", 1)
			d.KeyID = ids.key
			return post("/v1/envelopes", sign(d, ids.keyPriv))
		}},
		{"POST batch of both", func(ids isolationIDs) req {
			d1 := inA(ids, ids.project, ids.event, 1)
			d1.TenantID, d1.KeyID = ids.tenant, ids.key
			d2 := inA(ids, ids.project2, ids.event+"-k", 1)
			d2.KeyID = ids.key
			return post("/v1/envelopes/batch", batchBody(sign(d1, ids.keyPriv), sign(d2, ids.keyPriv)))
		}},
		{"POST envelope reusing the other tenant's event id and idempotency key", func(ids isolationIDs) req {
			return post("/v1/envelopes", o.sign(inA(ids, ids.project, ids.event, 1)))
		}},
		{"POST the same again (now tenant-a's own duplicate)", func(ids isolationIDs) req {
			return post("/v1/envelopes", o.sign(inA(ids, ids.project, ids.event, 1)))
		}},
		{"GET stream envelopes after the write", func(ids isolationIDs) req {
			return get("/v1/streams/" + ids.project + "/" + deviceA + "/envelopes")
		}},
	}
	roles := []struct {
		name, token string
	}{{"device", o.device}, {"service", o.service}, {"operator", o.operator}}

	cases, differ := 0, 0
	answersSeen := map[string]bool{}
	for _, p := range probes {
		for _, role := range roles {
			rb, rn := p.req(b), p.req(none)
			rb.token, rn.token = role.token, role.token
			gotB, gotNone := o.do(rb), o.do(rn)
			cases++
			nb, nn := normalized(t, gotB), normalized(t, gotNone)
			answersSeen[fmt.Sprint(gotB.status)] = true
			if p.name == "GET stream envelopes after the write" && role.name == "service" {
				// The pages hold tenant-a's own envelopes, which carry the
				// probed ids; compare them with the ids swapped back.
				nn = strings.NewReplacer(none.project, b.project, none.event, b.event, none.idem, b.idem).Replace(nn)
				if stripSignatures(nb) != stripSignatures(nn) || !strings.Contains(nb, `"sequence":1`) || strings.Contains(nb, `"sequence":2`) {
					differ++
					t.Errorf("%s as %s:\n tenant-b ids: %s\n unknown ids:  %s", p.name, role.name, nb, nn)
				}
				continue
			}
			if nb != nn {
				differ++
				t.Errorf("%s as %s:\n tenant-b ids: %s\n unknown ids:  %s", p.name, role.name, nb, nn)
			}
		}
	}
	if after := snapshot(); after != before {
		t.Errorf("tenant-b's rows changed:\nbefore\n%s\nafter\n%s", before, after)
	}
	// The probes were not vacuous: they reached reads, refusals and writes.
	for _, s := range []string{"200", "403", "404", "422"} {
		if !answersSeen[s] {
			t.Errorf("no probe answered %s", s)
		}
	}
	t.Logf("%d probes x %d roles = %d cases, %d differed", len(probes), len(roles), cases, differ)
}

// stripSignatures drops signature values, which differ whenever signed
// content differs.
func stripSignatures(s string) string {
	for {
		i := strings.Index(s, `"signature":"`)
		if i < 0 {
			return s
		}
		j := strings.IndexByte(s[i+13:], '"')
		s = s[:i] + `"signature":<sig>` + s[i+13+j+1:]
	}
}
