package producer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

func TestDecodeBase64URL(t *testing.T) {
	raw := []byte{0xfb, 0xff, 0x01, 0x02} // has - and _ in base64url, and two padding characters
	unpadded := base64.RawURLEncoding.EncodeToString(raw)
	padded := base64.URLEncoding.EncodeToString(raw)
	for _, s := range []string{unpadded, padded, " " + padded + "\n"} {
		got, err := DecodeBase64URL(s)
		if err != nil || !bytes.Equal(got, raw) {
			t.Errorf("DecodeBase64URL(%q) = %x, %v; want %x", s, got, err, raw)
		}
	}
	for _, s := range []string{
		padded[:len(padded)-1],                 // half the padding
		base64.StdEncoding.EncodeToString(raw), // + and / are not base64url
		unpadded[:len(unpadded)-1] + "9",       // non-zero trailing bits
		"@@@@",
	} {
		if _, err := DecodeBase64URL(s); err == nil {
			t.Errorf("DecodeBase64URL(%q) accepted", s)
		}
	}
}

func TestParseSeed(t *testing.T) {
	seed := bytes.Repeat([]byte{7}, SeedSize)
	want := ed25519.NewKeyFromSeed(seed)
	for _, s := range []string{EncodeBase64URL(seed), base64.URLEncoding.EncodeToString(seed)} {
		priv, err := ParseSeed(s)
		if err != nil || !priv.Equal(want) {
			t.Fatalf("ParseSeed(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", EncodeBase64URL(seed[:31]), EncodeBase64URL(append(seed, 1)), "not base64!"} {
		if _, err := ParseSeed(s); err == nil {
			t.Errorf("ParseSeed(%q) accepted", s)
		}
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	seedPath := filepath.Join(dir, "seed")
	seed := bytes.Repeat([]byte{9}, SeedSize)
	if err := WriteSecretFile(seedPath, EncodeBase64URL(seed)+"\n"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(seedPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("seed file mode %v, want 0600", fi.Mode().Perm())
	}
	if err := WriteSecretFile(seedPath, "other"); !errors.Is(err, os.ErrExist) {
		t.Errorf("overwriting a secret file: %v, want ErrExist", err)
	}
	priv, err := ReadSeedFile(seedPath)
	if err != nil || !priv.Equal(ed25519.NewKeyFromSeed(seed)) {
		t.Fatalf("ReadSeedFile: %v", err)
	}

	tokPath := filepath.Join(dir, "token")
	if err := WriteSecretFile(tokPath, "ewc_abc-DEF_123\n"); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadTokenFile(tokPath); err != nil || tok != "ewc_abc-DEF_123" {
		t.Errorf("ReadTokenFile = %q, %v", tok, err)
	}

	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("a"), maxSecretFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTokenFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized token file: %v", err)
	}
	if _, err := ReadSeedFile(tokPath); err == nil {
		t.Error("a token file was accepted as a seed")
	}
	if _, err := ReadSeedFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing seed file: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTokenFile(empty); err == nil {
		t.Error("an empty token file was accepted")
	}
}

func TestCheckToken(t *testing.T) {
	if err := CheckToken("abc.DEF-_~"); err != nil {
		t.Errorf("printable token refused: %v", err)
	}
	for _, tok := range []string{"", "a b", "a\nb", "tök"} {
		if CheckToken(tok) == nil {
			t.Errorf("CheckToken(%q) accepted", tok)
		}
	}
}

func TestCheckURL(t *testing.T) {
	ok := []struct {
		raw          string
		loopbackOnly bool
		want         string
	}{
		{"http://127.0.0.1:8080", true, "http://127.0.0.1:8080/v1/envelopes"},
		{"http://127.0.0.2:8080/", true, "http://127.0.0.2:8080/v1/envelopes"},
		{"http://localhost:8080/base/", true, "http://localhost:8080/base/v1/envelopes"},
		{"http://[::1]:8080", true, "http://[::1]:8080/v1/envelopes"},
		{"https://ingest.example.com", false, "https://ingest.example.com/v1/envelopes"},
	}
	for _, c := range ok {
		u, err := CheckURL(c.raw, c.loopbackOnly)
		if err != nil {
			t.Errorf("CheckURL(%q) = %v", c.raw, err)
			continue
		}
		if got := Endpoint(u, "/v1/envelopes"); got != c.want {
			t.Errorf("Endpoint(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
	bad := []struct {
		raw          string
		loopbackOnly bool
		msg          string
	}{
		{"http://ingest.example.com", false, "plain http"},
		{"http://10.0.0.1:8080", false, "plain http"},
		{"https://ingest.example.com", true, "only loopback"},
		{"ftp://127.0.0.1", false, "scheme"},
		{"//127.0.0.1:8080", false, "scheme"},
		{"127.0.0.1:8080", false, "does not parse"},
		{"http://", false, "no host"},
		{"http://user:pw@127.0.0.1", false, "user info"},
		{"http://127.0.0.1/?a=b", false, "without query"},
		{"http://[::1", false, "does not parse"},
	}
	for _, c := range bad {
		_, err := CheckURL(c.raw, c.loopbackOnly)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("CheckURL(%q, %v) = %v, want an error about %q", c.raw, c.loopbackOnly, err, c.msg)
		}
		if err != nil && strings.Contains(err.Error(), "pw@") {
			t.Errorf("CheckURL echoed a password: %v", err)
		}
	}
}

// A refused URL's user info and query never reach the error: each of these
// is refused, and each error still names the host.
func TestCheckURLErrorsHoldNoSecret(t *testing.T) {
	for _, raw := range []string{
		"http://user-1:pass-1@127.0.0.1:8080",
		"https://127.0.0.1:8080/?token=tok-1",
		"https://user-1@127.0.0.1:8080/#tok-1",
		"http://ingest.example.com/?token=tok-1",
		"ftp://user-1:pass-1@127.0.0.1/?token=tok-1",
	} {
		_, err := CheckURL(raw, false)
		if err == nil {
			t.Errorf("CheckURL(%q) accepted", raw)
			continue
		}
		for _, secret := range []string{"user-1", "pass-1", "tok-1"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("CheckURL(%q): %v holds %q", raw, err, secret)
			}
		}
		if !strings.Contains(err.Error(), "example.com") && !strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("CheckURL(%q): %v does not name the host", raw, err)
		}
	}
}

func TestPost(t *testing.T) {
	var got struct {
		method, path, auth, ctype, idem string
		body                            []byte
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path = r.Method, r.URL.Path
		got.auth, got.ctype, got.idem = r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key")
		got.body, _ = io.ReadAll(r.Body)
		w.Header().Set("X-Correlation-Id", "c-1")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"outcome":"refused","reason":"event_conflict"}`)
	}))
	defer srv.Close()
	u, err := CheckURL(srv.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("Idempotency-Key", "k-1")
	ans, err := Post(context.Background(), srv.Client(), Endpoint(u, "/v1/envelopes"), "tok", []byte(`{"a":1}`), h)
	if err != nil {
		t.Fatal(err)
	}
	if ans.Status != http.StatusConflict || string(ans.Body) != `{"outcome":"refused","reason":"event_conflict"}` || ans.CorrelationID != "c-1" {
		t.Errorf("answer = %+v", ans)
	}
	if got.method != http.MethodPost || got.path != "/v1/envelopes" || got.auth != "Bearer tok" ||
		got.ctype != "application/json" || got.idem != "k-1" || string(got.body) != `{"a":1}` {
		t.Errorf("request = %+v", got)
	}

	srv.Close()
	if _, err := Post(context.Background(), srv.Client(), Endpoint(u, "/v1/envelopes"), "tok", nil, nil); err == nil {
		t.Error("posting to a closed server succeeded")
	}
}

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
			d, err := ParseDraft(draftOf(t, v.Body), time.Now(), true)
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
	d, err := ParseDraft([]byte(goodDraft), now, true)
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
		d, err := ParseDraft([]byte(doc), now, true)
		if err != nil {
			t.Fatal(err)
		}
		if !d.IssuedAt.Equal(now.Truncate(time.Second)) {
			t.Errorf("issued_at %s = %v, want the signing time %v", issued, d.IssuedAt, now.Truncate(time.Second))
		}
	}
	withVersion := strings.Replace(goodDraft, `"tenant_id"`, `"schema_version":1,"tenant_id"`, 1)
	if _, err := ParseDraft([]byte(withVersion), now, true); err != nil {
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
			_, err := ParseDraft([]byte(c.doc), time.Now(), true)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("ParseDraft = %v, want an error containing %q", err, c.msg)
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
		ds, err := ParseDraftBatch([]byte(doc), time.Now(), true)
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
		if _, err := ParseDraftBatch([]byte(c.doc), time.Now(), true); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: ParseDraftBatch = %v, want an error containing %q", c.name, err, c.msg)
		}
	}
}

func TestParseDraftUnsequenced(t *testing.T) {
	if _, err := ParseDraft([]byte(goodDraft), time.Now(), false); err == nil || !strings.Contains(err.Error(), `leave out "sequence"`) {
		t.Errorf("a sequence in an unsequenced draft: %v", err)
	}
	without := strings.Replace(goodDraft, `"sequence":3,`, "", 1)
	if without == goodDraft {
		t.Fatal("test bug: no sequence to remove")
	}
	d, err := ParseDraft([]byte(without), time.Now(), false)
	if err != nil || d.Sequence != 0 || d.EventID != "e1" {
		t.Errorf("%+v %v", d, err)
	}
	if _, err := ParseDraft([]byte(without), time.Now(), true); err == nil || !strings.Contains(err.Error(), `lacks member "sequence"`) {
		t.Errorf("a sequenced draft without sequence: %v", err)
	}
}
