package envctl

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// Drafts: what envctl send reads before it signs (draft.go).

// The vectors are the contract's shared test vectors (shared/vectors/envelopes.json of the contract
// repository), copied here so the module's tests stand alone.
type vectorFile struct {
	Seed    string `json:"private_seed_hex"`
	Vectors []struct {
		Name         string `json:"name"`
		Body         string `json:"body"`
		SigningInput string `json:"signing_input_base64"`
		ValidSig     bool   `json:"expect_valid_signature"`
		Reason       string `json:"expect_reason"`
	} `json:"vectors"`
}

func loadVectors(t *testing.T) (vectorFile, ed25519.PrivateKey) {
	t.Helper()
	b, err := os.ReadFile("testdata/envelopes.json")
	if err != nil {
		t.Fatal(err)
	}
	var vf vectorFile
	if err := json.Unmarshal(b, &vf); err != nil {
		t.Fatal(err)
	}
	seed, err := hex.DecodeString(vf.Seed)
	if err != nil {
		t.Fatal(err)
	}
	return vf, ed25519.NewKeyFromSeed(seed)
}

// draftOf turns a vector body into a draft file: the same members without the signature.
func draftOf(t *testing.T, body string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "signature")
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Signing a vector's draft must reproduce the vector's signing input and, Ed25519 being deterministic,
// its signature: what envctl send puts on the wire is what an independent implementation signs.
func TestDraftReproducesVectors(t *testing.T) {
	vf, priv := loadVectors(t)
	checked := 0
	for _, v := range vf.Vectors {
		if !v.ValidSig {
			continue
		}
		t.Run(v.Name, func(t *testing.T) {
			d, err := parseDraft(draftOf(t, v.Body), time.Now(), true)
			if v.Reason == "invalid_metadata" {
				if err == nil || !strings.Contains(err.Error(), "metadata has unknown member") {
					t.Fatalf("draft with unknown metadata: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			e, err := envelope.Sign(d, priv)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := base64.StdEncoding.DecodeString(v.SigningInput)
			if !bytes.Equal(e.SigningInput(), want) {
				t.Errorf("signing input\n got %s\nwant %s", e.SigningInput(), want)
			}
			parsed, err := envelope.Parse([]byte(v.Body))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(e.Signature, parsed.Signature) {
				t.Error("signature differs from the vector's")
			}
			checked++
		})
	}
	if checked < 4 {
		t.Fatalf("only %d vectors checked", checked)
	}
}

const goodDraft = `{"tenant_id":"t1","project_id":"p1","producer_id":"d1","event_id":"e1","idempotency_key":"k1",
 "key_id":"key1","sequence":3,"issued_at":"2026-11-29T20:00:00.5Z","metadata":{"kind":"a.b","correlation_id":"c-1"},
 "payload":{"z":1,"a":[true,null]}}`

func TestParseDraft(t *testing.T) {
	now := time.Date(2026, 11, 29, 21, 0, 0, 123, time.UTC)
	d, err := parseDraft([]byte(goodDraft), now, true)
	if err != nil {
		t.Fatal(err)
	}
	want := envelope.Draft{
		TenantID: "t1", ProjectID: "p1", ProducerID: "d1", EventID: "e1", IdempotencyKey: "k1", KeyID: "key1",
		Sequence: 3, IssuedAt: time.Date(2026, 11, 29, 20, 0, 0, 5e8, time.UTC),
		Metadata: envelope.Metadata{Kind: "a.b", CorrelationID: "c-1"}, Payload: []byte(`{"a":[true,null],"z":1}`),
	}
	if d.TenantID != want.TenantID || d.ProjectID != want.ProjectID || d.ProducerID != want.ProducerID ||
		d.EventID != want.EventID || d.IdempotencyKey != want.IdempotencyKey || d.KeyID != want.KeyID ||
		d.Sequence != want.Sequence || !d.IssuedAt.Equal(want.IssuedAt) || d.Metadata != want.Metadata ||
		!bytes.Equal(d.Payload, want.Payload) {
		t.Errorf("draft\n got %+v\nwant %+v", d, want)
	}

	for _, issued := range []string{`"now"`, ``} {
		doc := strings.Replace(goodDraft, `"issued_at":"2026-11-29T20:00:00.5Z",`, "", 1)
		if issued != "" {
			doc = strings.Replace(goodDraft, `"2026-11-29T20:00:00.5Z"`, issued, 1)
		}
		d, err := parseDraft([]byte(doc), now, true)
		if err != nil {
			t.Fatal(err)
		}
		if !d.IssuedAt.Equal(now.Truncate(time.Second)) {
			t.Errorf("issued_at %s = %v, want the signing time %v", issued, d.IssuedAt, now.Truncate(time.Second))
		}
	}
	withVersion := strings.Replace(goodDraft, `"tenant_id"`, `"schema_version":1,"tenant_id"`, 1)
	if _, err := parseDraft([]byte(withVersion), now, true); err != nil {
		t.Errorf("schema_version 1 refused: %v", err)
	}
}

func TestParseDraftRefusals(t *testing.T) {
	repl := func(old, new string) string {
		if !strings.Contains(goodDraft, old) {
			t.Fatalf("test bug: %q not in the draft", old)
		}
		return strings.Replace(goodDraft, old, new, 1)
	}
	cases := []struct{ name, doc, msg string }{
		{"not json", `{"tenant_id":`, "not acceptable JSON"},
		{"array", `[1]`, "must be a JSON object"},
		{"duplicate member", repl(`"tenant_id":"t1"`, `"tenant_id":"t1","tenant_id":"t2"`), "not acceptable JSON"},
		{"signature", repl(`"tenant_id"`, `"signature":"AAAA","tenant_id"`), "must not carry a \"signature\""},
		{"unknown member", repl(`"tenant_id"`, `"Tenant_id":"x","tenant_id"`), `unknown member(s) "Tenant_id"`},
		{"missing member", repl(`"event_id":"e1",`, ""), `lacks member "event_id"`},
		{"schema 2", repl(`"tenant_id"`, `"schema_version":2,"tenant_id"`), "schema_version"},
		{"string sequence", repl(`"sequence":3`, `"sequence":"3"`), "sequence"},
		{"fraction sequence", repl(`"sequence":3`, `"sequence":3.5`), "sequence"},
		{"number tenant", repl(`"tenant_id":"t1"`, `"tenant_id":1`), `"tenant_id" must be a string`},
		{"issued_at offset", repl(`2026-11-29T20:00:00.5Z`, `2026-11-29T20:00:00+01:00`), "RFC 3339 with Z"},
		{"issued_at garbage", repl(`2026-11-29T20:00:00.5Z`, `yesterday`), "RFC 3339 with Z"},
		{"issued_at number", repl(`"2026-11-29T20:00:00.5Z"`, `1`), "issued_at"},
		{"metadata array", repl(`{"kind":"a.b","correlation_id":"c-1"}`, `[]`), `"metadata" must be an object`},
		{"metadata unknown", repl(`"correlation_id":"c-1"`, `"extra":"x"`), `unknown member(s) "extra"`},
		{"metadata number", repl(`"kind":"a.b"`, `"kind":1`), `metadata "kind" must be a string`},
		{"invalid utf-8", repl(`"e1"`, "\"e\xff\""), "not acceptable JSON"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseDraft([]byte(c.doc), time.Now(), true)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("parseDraft = %v, want an error containing %q", err, c.msg)
			}
		})
	}
}

func TestParseDraftBatch(t *testing.T) {
	second := strings.Replace(goodDraft, `"sequence":3`, `"sequence":4`, 1)
	for _, doc := range []string{
		`{"envelopes":[` + goodDraft + `,` + second + `]}`,
		" [" + goodDraft + "," + second + "]\n",
	} {
		ds, err := parseDraftBatch([]byte(doc), time.Now(), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(ds) != 2 || ds[0].Sequence != 3 || ds[1].Sequence != 4 {
			t.Errorf("batch = %+v", ds)
		}
	}
	many := "[" + strings.TrimSuffix(strings.Repeat(goodDraft+",", envelope.MaxBatch+1), ",") + "]"
	bad := []struct{ name, doc, msg string }{
		{"empty", `{"envelopes":[]}`, "batch draft"},
		{"too many", many, "batch draft"},
		{"other wrapper member", `{"envelopes":[` + goodDraft + `],"x":1}`, "batch draft"},
		{"bad item", `[` + goodDraft + `,{"tenant_id":"t"}]`, "batch draft item 1"},
		{"item not object", `[` + goodDraft + `,1]`, "batch draft item 1"},
	}
	for _, c := range bad {
		if _, err := parseDraftBatch([]byte(c.doc), time.Now(), true); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: parseDraftBatch = %v, want an error containing %q", c.name, err, c.msg)
		}
	}
}

func TestParseDraftUnsequenced(t *testing.T) {
	if _, err := parseDraft([]byte(goodDraft), time.Now(), false); err == nil || !strings.Contains(err.Error(), `leave out "sequence"`) {
		t.Errorf("a sequence in an unsequenced draft: %v", err)
	}
	without := strings.Replace(goodDraft, `"sequence":3,`, "", 1)
	if without == goodDraft {
		t.Fatal("test bug: no sequence to remove")
	}
	d, err := parseDraft([]byte(without), time.Now(), false)
	if err != nil || d.Sequence != 0 || d.EventID != "e1" {
		t.Errorf("%+v %v", d, err)
	}
	if _, err := parseDraft([]byte(without), time.Now(), true); err == nil || !strings.Contains(err.Error(), `lacks member "sequence"`) {
		t.Errorf("a sequenced draft without sequence: %v", err)
	}
}
