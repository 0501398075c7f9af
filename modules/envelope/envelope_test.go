package envelope

import (
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

const absent = "\x00absent"

// goodSig is a well-formed (not a valid) signature: step 2 only checks shape.
var goodSig = `"` + strings.Repeat("A", 85) + `Q"`

func baseMembers() map[string]string {
	return map[string]string{
		"schema_version":  `1`,
		"tenant_id":       `"tenant-a"`,
		"project_id":      `"proj-1"`,
		"producer_id":     `"device-7"`,
		"event_id":        `"evt-1"`,
		"idempotency_key": `"idem-1"`,
		"key_id":          `"k1"`,
		"sequence":        `1`,
		"issued_at":       `"2026-11-29T20:00:00Z"`,
		"metadata":        `{"kind":"task.status"}`,
		"payload":         `{"n":1}`,
		"signature":       goodSig,
	}
}

// validBody renders the base envelope with overrides applied (absent
// deletes a member, an unknown name adds one), members in a fixed,
// non-canonical order so the reader has to sort.
func validBody(t testing.TB, over map[string]string) []byte {
	t.Helper()
	m := baseMembers()
	for k, v := range over {
		if v == absent {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.Reverse(keys)
	var b strings.Builder
	b.WriteString("{\n")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(",\n")
		}
		b.WriteString(`  "` + k + `": ` + m[k])
	}
	b.WriteString("\n}")
	return []byte(b.String())
}

func TestParseAccepts(t *testing.T) {
	cases := []map[string]string{
		{},
		{"tenant_id": `"` + strings.Repeat("a", 64) + `"`},
		{"tenant_id": `"A.b_c-9"`, "project_id": `"0"`, "key_id": `"Z"`},
		{"event_id": `"` + strings.Repeat("e", 128) + `"`},
		{"event_id": `"urn:evt:1"`},
		{"idempotency_key": `"` + strings.Repeat("~", 255) + `"`},
		{"idempotency_key": `"!\"\\/{}~"`},
		{"idempotency_key": `"\u0041\u0021"`},
		{"sequence": `9007199254740991`},
		{"issued_at": `"2026-11-29T20:00:00.5Z"`},
		{"issued_at": `"2026-11-29T20:00:00.123456789Z"`},
		{"issued_at": `"2026-11-29T20:00:00.1234567891234Z"`}, // RFC 3339 bounds no fraction; past ns is dropped
		{"issued_at": `"2028-02-29T23:59:59Z"`},
		{"issued_at": `"2000-02-29T00:00:00Z"`},
		{"payload": `null`},
		{"payload": `"text"`},
		{"payload": `[1,2,3]`},
		{"payload": `-0`},
		{"metadata": `{}`},                    // step 4's business
		{"metadata": `{"kind":1,"other":[]}`}, // step 4's business
		{"schema_version": `2`},               // step 4's business
		{"schema_version": `-0`},
		{"schema_version": `123456789012345678901234567890`},
		{"signature": `"` + strings.Repeat("_", 85) + `w"`},
	}
	for _, over := range cases {
		body := validBody(t, over)
		e, err := Parse(body)
		if err != nil {
			t.Errorf("Parse(%s): %v", body, err)
			continue
		}
		if e.TenantID == "" || e.Sequence < 1 || len(e.Signature) != 64 || e.IssuedAt.IsZero() {
			t.Errorf("Parse(%s) filled %+v", body, e)
		}
	}
}

func TestParseFields(t *testing.T) {
	e, err := Parse(validBody(t, map[string]string{
		"idempotency_key": `"a\"b\\c"`,
		"issued_at":       `"2026-11-29T20:00:01.25Z"`,
		"sequence":        `42`,
		"payload":         `{"z":1,"a":[1.0,"\u00e9"]}`,
		"metadata":        `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","kind":"task.status","correlation_id":"c-1"}`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := Envelope{
		SchemaVersion: 1, TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7",
		EventID: "evt-1", IdempotencyKey: `a"b\c`, KeyID: "k1", Sequence: 42,
		IssuedAt: time.Date(2026, 11, 29, 20, 0, 1, 250000000, time.UTC),
		Metadata: Metadata{Kind: "task.status", CorrelationID: "c-1", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	got := *e
	if got.SchemaVersion != want.SchemaVersion || got.TenantID != want.TenantID || got.ProjectID != want.ProjectID ||
		got.ProducerID != want.ProducerID || got.EventID != want.EventID || got.IdempotencyKey != want.IdempotencyKey ||
		got.KeyID != want.KeyID || got.Sequence != want.Sequence || !got.IssuedAt.Equal(want.IssuedAt) ||
		got.IssuedAt.Location() != time.UTC || got.Metadata != want.Metadata {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if string(e.Payload) != `{"a":[1,"é"],"z":1}` {
		t.Fatalf("payload %s", e.Payload)
	}
	if string(e.Signature) != string(make([]byte, 63))+"\x01" {
		t.Fatalf("signature %x", e.Signature)
	}
	if string(e.SigningInput()[:len(SigningPrefix)]) != SigningPrefix || strings.Contains(string(e.SigningInput()), "signature") {
		t.Fatalf("signing input %q", e.SigningInput())
	}
	if !strings.Contains(string(e.Canonical()), `"sequence":42,"signature":"AAAA`) {
		t.Fatalf("canonical %s", e.Canonical())
	}
	// Metadata of an envelope whose metadata fails step 4 stays empty.
	e, err = Parse(validBody(t, map[string]string{"metadata": `{"kind":"ok","x":"y"}`}))
	if err != nil || e.Metadata != (Metadata{}) {
		t.Fatalf("invalid metadata filled: %+v, %v", e, err)
	}
}

func TestParseRefusals(t *testing.T) {
	cases := []struct {
		name string
		over map[string]string
	}{
		{"unknown member", map[string]string{"extra": `1`}},
		{"member differs in case", map[string]string{"sequence": absent, "Sequence": `1`}},
		{"schema_version string", map[string]string{"schema_version": `"1"`}},
		{"schema_version 1.0", map[string]string{"schema_version": `1.0`}},
		{"schema_version 1e0", map[string]string{"schema_version": `1e0`}},
		{"schema_version null", map[string]string{"schema_version": `null`}},
		{"schema_version bool", map[string]string{"schema_version": `true`}},
		{"tenant_id empty", map[string]string{"tenant_id": `""`}},
		{"tenant_id 65", map[string]string{"tenant_id": `"` + strings.Repeat("a", 65) + `"`}},
		{"tenant_id leading dash", map[string]string{"tenant_id": `"-a"`}},
		{"tenant_id leading dot", map[string]string{"tenant_id": `".a"`}},
		{"tenant_id space", map[string]string{"tenant_id": `"a b"`}},
		{"tenant_id colon", map[string]string{"tenant_id": `"a:b"`}},
		{"tenant_id non-ASCII", map[string]string{"tenant_id": `"caf\u00e9"`}},
		{"tenant_id number", map[string]string{"tenant_id": `7`}},
		{"tenant_id null", map[string]string{"tenant_id": `null`}},
		{"project_id slash", map[string]string{"project_id": `"a/b"`}},
		{"producer_id array", map[string]string{"producer_id": `["d"]`}},
		{"key_id escaped quote", map[string]string{"key_id": `"a\"b"`}},
		{"event_id 129", map[string]string{"event_id": `"` + strings.Repeat("e", 129) + `"`}},
		{"event_id leading colon", map[string]string{"event_id": `":e"`}},
		{"event_id space", map[string]string{"event_id": `"e 1"`}},
		{"idempotency_key empty", map[string]string{"idempotency_key": `""`}},
		{"idempotency_key 256", map[string]string{"idempotency_key": `"` + strings.Repeat("k", 256) + `"`}},
		{"idempotency_key space", map[string]string{"idempotency_key": `"a b"`}},
		{"idempotency_key DEL", map[string]string{"idempotency_key": `"a\u007f"`}},
		{"idempotency_key tab", map[string]string{"idempotency_key": `"a\tb"`}},
		{"idempotency_key non-ASCII", map[string]string{"idempotency_key": `"\u00e9"`}},
		{"idempotency_key number", map[string]string{"idempotency_key": `1`}},
		{"sequence 0", map[string]string{"sequence": `0`}},
		{"sequence -0", map[string]string{"sequence": `-0`}},
		{"sequence negative", map[string]string{"sequence": `-1`}},
		{"sequence 2^53", map[string]string{"sequence": `9007199254740992`}},
		{"sequence huge", map[string]string{"sequence": `99999999999999999999999`}},
		{"sequence 1.0", map[string]string{"sequence": `1.0`}},
		{"sequence 1e0", map[string]string{"sequence": `1e0`}},
		{"sequence 1.5", map[string]string{"sequence": `1.5`}},
		{"sequence string", map[string]string{"sequence": `"1"`}},
		{"issued_at offset", map[string]string{"issued_at": `"2026-11-29T20:00:00+00:00"`}},
		{"issued_at lowercase z", map[string]string{"issued_at": `"2026-11-29T20:00:00z"`}},
		{"issued_at lowercase t", map[string]string{"issued_at": `"2026-11-29t20:00:00Z"`}},
		{"issued_at space", map[string]string{"issued_at": `"2026-11-29 20:00:00Z"`}},
		{"issued_at no seconds", map[string]string{"issued_at": `"2026-11-29T20:00Z"`}},
		{"issued_at Feb 30", map[string]string{"issued_at": `"2026-02-30T00:00:00Z"`}},
		{"issued_at Feb 29 non-leap", map[string]string{"issued_at": `"2026-02-29T00:00:00Z"`}},
		{"issued_at 1900-02-29", map[string]string{"issued_at": `"1900-02-29T00:00:00Z"`}},
		{"issued_at month 13", map[string]string{"issued_at": `"2026-13-01T00:00:00Z"`}},
		{"issued_at hour 24", map[string]string{"issued_at": `"2026-11-29T24:00:00Z"`}},
		{"issued_at leap second", map[string]string{"issued_at": `"2026-12-31T23:59:60Z"`}},
		{"issued_at empty fraction", map[string]string{"issued_at": `"2026-11-29T20:00:00.Z"`}},
		{"issued_at fraction letter", map[string]string{"issued_at": `"2026-11-29T20:00:00.1234567890aZ"`}},
		{"issued_at trailing", map[string]string{"issued_at": `"2026-11-29T20:00:00ZZ"`}},
		{"issued_at signed digits", map[string]string{"issued_at": `"2026-+1-29T20:00:00Z"`}},
		{"issued_at number", map[string]string{"issued_at": `1764446400`}},
		{"metadata string", map[string]string{"metadata": `"task"`}},
		{"metadata array", map[string]string{"metadata": `[]`}},
		{"metadata null", map[string]string{"metadata": `null`}},
		{"signature 85 chars", map[string]string{"signature": `"` + strings.Repeat("A", 85) + `"`}},
		{"signature 87 chars", map[string]string{"signature": `"` + strings.Repeat("A", 87) + `"`}},
		{"signature padded", map[string]string{"signature": `"` + strings.Repeat("A", 86) + `=="`}},
		{"signature standard alphabet", map[string]string{"signature": `"` + strings.Repeat("+", 85) + `A"`}},
		{"signature trailing bits", map[string]string{"signature": `"` + strings.Repeat("A", 85) + `B"`}},
		{"signature with newline", map[string]string{"signature": `"` + strings.Repeat("A", 84) + `\nA"`}},
		{"signature number", map[string]string{"signature": `1`}},
		{"duplicate in payload", map[string]string{"payload": `{"a":1,"a":1}`}},
		{"overflow in payload", map[string]string{"payload": `[1e309]`}},
		{"lone surrogate in payload", map[string]string{"payload": `"\udfff"`}},
	}
	for _, member := range []string{"schema_version", "tenant_id", "project_id", "producer_id", "event_id",
		"idempotency_key", "key_id", "sequence", "issued_at", "metadata", "payload", "signature"} {
		cases = append(cases, struct {
			name string
			over map[string]string
		}{"missing " + member, map[string]string{member: absent}})
	}
	for _, c := range cases {
		_, err := Parse(validBody(t, c.over))
		var e *Error
		if !errors.As(err, &e) || e.Reason != ReasonInvalidEnvelope || e.Detail == "" {
			t.Errorf("%s: got %v, want invalid_envelope", c.name, err)
		}
	}
	for _, doc := range []string{`[]`, `"x"`, `1`, `null`, `{}`, `{"a":1}`} {
		if r, _ := ReasonOf(parseErr(doc)); r != ReasonInvalidEnvelope {
			t.Errorf("Parse(%s): want invalid_envelope", doc)
		}
	}
	// Two members of the same name are refused even though each alone is fine.
	dup := strings.Replace(string(validBody(t, nil)), `"sequence": 1`, `"sequence": 1, "sequence": 1`, 1)
	if r, _ := ReasonOf(parseErr(dup)); r != ReasonInvalidEnvelope {
		t.Errorf("duplicate sequence accepted")
	}
}

func parseErr(doc string) error {
	_, err := Parse([]byte(doc))
	return err
}

// Details name the rule and the contract's member, never request content.
func TestErrorDetailsDoNotEchoContent(t *testing.T) {
	const secret = "SECRETzzz"
	bodies := []map[string]string{
		{"SECRETzzz": `1`},
		{"payload": `{"SECRETzzz":1,"SECRETzzz":2}`},
		{"payload": `["SECRETzzz` + "\\ud800" + `"]`},
		{"idempotency_key": `"SECRETzzz "`},
		{"tenant_id": `"SECRETzzz/"`},
		{"signature": `"SECRETzzz"`},
		{"issued_at": `"SECRETzzz"`},
		{"metadata": `{"kind":"task","SECRETzzz":"x"}`},
		{"metadata": `{"kind":"SECRETzzz"}`},
	}
	for _, over := range bodies {
		e, err := Parse(validBody(t, over))
		if err == nil {
			err = e.Validate(time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC), 0)
		}
		if err == nil {
			t.Fatalf("%v: accepted", over)
		}
		if strings.Contains(strings.ToLower(err.Error()), strings.ToLower(secret)) {
			t.Errorf("error echoes content: %v", err)
		}
	}
}

func TestValidateStep4(t *testing.T) {
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	type tc struct {
		name   string
		over   map[string]string
		now    time.Time
		window time.Duration
		want   Reason // "" = passes
	}
	ts := func(t time.Time) string { return `"` + t.UTC().Format(time.RFC3339Nano) + `"` }
	cases := []tc{
		{"valid", nil, now, 0, ""},
		{"schema 2", map[string]string{"schema_version": `2`}, now, 0, ReasonUnsupportedSchema},
		{"schema 0", map[string]string{"schema_version": `0`}, now, 0, ReasonUnsupportedSchema},
		{"schema -1", map[string]string{"schema_version": `-1`}, now, 0, ReasonUnsupportedSchema},
		{"schema huge", map[string]string{"schema_version": `18446744073709551617`}, now, 0, ReasonUnsupportedSchema},
		{"schema before metadata", map[string]string{"schema_version": `2`, "metadata": `{}`}, now, 0, ReasonUnsupportedSchema},
		{"metadata empty", map[string]string{"metadata": `{}`}, now, 0, ReasonInvalidMetadata},
		{"metadata unknown member", map[string]string{"metadata": `{"kind":"a","priority":"high"}`}, now, 0, ReasonInvalidMetadata},
		{"metadata Kind case", map[string]string{"metadata": `{"Kind":"a"}`}, now, 0, ReasonInvalidMetadata},
		{"kind number", map[string]string{"metadata": `{"kind":1}`}, now, 0, ReasonInvalidMetadata},
		{"kind null", map[string]string{"metadata": `{"kind":null}`}, now, 0, ReasonInvalidMetadata},
		{"kind empty", map[string]string{"metadata": `{"kind":""}`}, now, 0, ReasonInvalidMetadata},
		{"kind upper", map[string]string{"metadata": `{"kind":"Task"}`}, now, 0, ReasonInvalidMetadata},
		{"kind digit first", map[string]string{"metadata": `{"kind":"1task"}`}, now, 0, ReasonInvalidMetadata},
		{"kind 65", map[string]string{"metadata": `{"kind":"` + strings.Repeat("k", 65) + `"}`}, now, 0, ReasonInvalidMetadata},
		{"kind 64", map[string]string{"metadata": `{"kind":"` + strings.Repeat("k", 64) + `"}`}, now, 0, ""},
		{"kind chars", map[string]string{"metadata": `{"kind":"a0_.-z"}`}, now, 0, ""},
		{"correlation ok", map[string]string{"metadata": `{"kind":"a","correlation_id":"A.b_c:d-1"}`}, now, 0, ""},
		{"correlation 128", map[string]string{"metadata": `{"kind":"a","correlation_id":"` + strings.Repeat("c", 128) + `"}`}, now, 0, ""},
		{"correlation 129", map[string]string{"metadata": `{"kind":"a","correlation_id":"` + strings.Repeat("c", 129) + `"}`}, now, 0, ReasonInvalidMetadata},
		{"correlation empty", map[string]string{"metadata": `{"kind":"a","correlation_id":""}`}, now, 0, ReasonInvalidMetadata},
		{"correlation slash", map[string]string{"metadata": `{"kind":"a","correlation_id":"a/b"}`}, now, 0, ReasonInvalidMetadata},
		{"correlation null", map[string]string{"metadata": `{"kind":"a","correlation_id":null}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent ok", map[string]string{"metadata": `{"kind":"a","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`}, now, 0, ""},
		{"traceparent upper", map[string]string{"metadata": `{"kind":"a","traceparent":"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent version 01", map[string]string{"metadata": `{"kind":"a","traceparent":"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent zero trace", map[string]string{"metadata": `{"kind":"a","traceparent":"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent zero parent", map[string]string{"metadata": `{"kind":"a","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent extra", map[string]string{"metadata": `{"kind":"a","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent short", map[string]string{"metadata": `{"kind":"a","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01"}`}, now, 0, ReasonInvalidMetadata},
		{"traceparent bad flags", map[string]string{"metadata": `{"kind":"a","traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g"}`}, now, 0, ReasonInvalidMetadata},
		{"metadata before time", map[string]string{"metadata": `{}`, "issued_at": ts(now.Add(time.Hour))}, now, 0, ReasonInvalidMetadata},
		{"future exactly 5m", map[string]string{"issued_at": ts(now.Add(5 * time.Minute))}, now, 0, ""},
		{"future 5m+1ns", map[string]string{"issued_at": ts(now.Add(5*time.Minute + time.Nanosecond))}, now, 0, ReasonIssuedInFuture},
		{"far future", map[string]string{"issued_at": `"9999-12-31T23:59:59Z"`}, now, 0, ReasonIssuedInFuture},
		{"default window exactly", map[string]string{"issued_at": ts(now.Add(-90 * 24 * time.Hour))}, now, 0, ""},
		{"default window +1ns", map[string]string{"issued_at": ts(now.Add(-90*24*time.Hour - time.Nanosecond))}, now, 0, ReasonExpired},
		{"custom window", map[string]string{"issued_at": ts(now.Add(-2 * time.Hour))}, now, time.Hour, ReasonExpired},
		{"custom window ok", map[string]string{"issued_at": ts(now.Add(-time.Hour))}, now, time.Hour, ""},
		{"year 0", map[string]string{"issued_at": `"0000-01-01T00:00:00Z"`}, now, 0, ReasonExpired},
		{"now in another zone", nil, now.In(time.FixedZone("X", 3600)), 0, ""},
	}
	for _, c := range cases {
		e, err := Parse(validBody(t, c.over))
		if err != nil {
			t.Errorf("%s: Parse: %v", c.name, err)
			continue
		}
		err = e.Validate(c.now, c.window)
		if c.want == "" {
			if err != nil {
				t.Errorf("%s: Validate: %v", c.name, err)
			}
			continue
		}
		if r, ok := ReasonOf(err); !ok || r != c.want {
			t.Errorf("%s: Validate = %v, want %s", c.name, err, c.want)
		}
	}
}

// A request stops at the first failing step: a structural error hides a bad
// signature, and a bad signature is reported by Verify (step 3) even when
// step 4 would also refuse.
func TestStepOrder(t *testing.T) {
	seed, _ := hex.DecodeString("2883bf4b47b0e8c3d7c9b52f7584ab2ba8c8fc99c4cd65876417505575efd591")
	pub := ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)
	e, err := Parse(validBody(t, map[string]string{
		"schema_version": `7`, "metadata": `{"x":1}`, "issued_at": `"2099-01-01T00:00:00Z"`,
	}))
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := ReasonOf(e.Verify(pub)); r != ReasonBadSignature {
		t.Fatalf("step 3: %v", e.Verify(pub))
	}
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	if r, _ := ReasonOf(e.Validate(now, 0)); r != ReasonUnsupportedSchema {
		t.Fatalf("step 4 order: %v", e.Validate(now, 0))
	}
	_, err = Parse(validBody(t, map[string]string{"sequence": `0`, "schema_version": `7`}))
	if r, _ := ReasonOf(err); r != ReasonInvalidEnvelope {
		t.Fatalf("step 2 first: %v", err)
	}
}

func TestIssuedAtLongFractionTruncates(t *testing.T) {
	e, err := Parse(validBody(t, map[string]string{"issued_at": `"2026-11-29T20:00:00.9999999999Z"`}))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 29, 20, 0, 0, 999999999, time.UTC); !e.IssuedAt.Equal(want) {
		t.Fatalf("IssuedAt = %v, want %v", e.IssuedAt, want)
	}
}
