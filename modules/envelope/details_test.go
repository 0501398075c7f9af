package envelope

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var knownDetails = KnownDetails(Limits{})

// requireKnownDetail fails unless err is an *Error whose Detail is one of
// the package's fixed sentences (contract §8.11).
func requireKnownDetail(t testing.TB, err error) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("not an *Error: %v", err)
	}
	if e.Detail == "" {
		t.Fatalf("%s without a detail", e.Reason)
	}
	if !slices.Contains(knownDetails, e.Detail) {
		t.Fatalf("detail %q is not one of KnownDetails", e.Detail)
	}
}

// Exact details of representative refusals: the sentence names the rule
// and the contract's member, never where the body broke or what it held.
func TestDetailsAreFixedSentences(t *testing.T) {
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
	for _, c := range []struct {
		name   string
		body   []byte
		reason Reason
		detail string
	}{
		{"not an object", []byte(`[1]`), ReasonInvalidEnvelope, "envelope must be a JSON object"},
		{"empty", []byte(` `), ReasonInvalidEnvelope, "json: empty document"},
		{"truncated", []byte(`{"a":`), ReasonInvalidEnvelope, "json: unexpected end of input"},
		{"garbage after", []byte(`{} x`), ReasonInvalidEnvelope, "json: data after the top-level value"},
		{"duplicate member", []byte(`{"a":1,"a":2}`), ReasonInvalidEnvelope, "json: duplicate member name in object"},
		{"lone surrogate", []byte(`{"a":"\ud800"}`), ReasonInvalidEnvelope, "json: lone surrogate"},
		{"depth", validBody(t, map[string]string{"payload": deep}), ReasonInvalidEnvelope, "json: nesting deeper than 64"},
		{"unknown member", validBody(t, map[string]string{"Sequence": `1`}), ReasonInvalidEnvelope, "unknown member"},
		{"missing member", validBody(t, map[string]string{"key_id": absent}), ReasonInvalidEnvelope, "missing member key_id"},
		{"schema type", validBody(t, map[string]string{"schema_version": `"1"`}), ReasonInvalidEnvelope, "schema_version: must be an integer"},
		{"tenant rule", validBody(t, map[string]string{"tenant_id": `"a/b"`}), ReasonInvalidEnvelope, "tenant_id: must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
		{"key type", validBody(t, map[string]string{"idempotency_key": `7`}), ReasonInvalidEnvelope, "idempotency_key: must be a string"},
		{"sequence range", validBody(t, map[string]string{"sequence": `0`}), ReasonInvalidEnvelope, "sequence: must be in 1..9007199254740991"},
		{"issued_at", validBody(t, map[string]string{"issued_at": `"yesterday"`}), ReasonInvalidEnvelope, "issued_at: must be RFC 3339 UTC with Z, e.g. 2026-11-29T20:00:00Z"},
		{"metadata type", validBody(t, map[string]string{"metadata": `[]`}), ReasonInvalidEnvelope, "metadata: must be an object"},
		{"signature", validBody(t, map[string]string{"signature": `"abc"`}), ReasonInvalidEnvelope, "signature: must be unpadded base64url of 64 bytes"},
		{"schema 2", validBody(t, map[string]string{"schema_version": `2`}), ReasonUnsupportedSchema, "schema_version: only 1 is supported"},
		{"metadata unknown", validBody(t, map[string]string{"metadata": `{"kind":"a","x":"y"}`}), ReasonInvalidMetadata, "metadata: unknown member"},
		{"metadata kind", validBody(t, map[string]string{"metadata": `{"kind":"A"}`}), ReasonInvalidMetadata, "metadata.kind: must match ^[a-z][a-z0-9_.-]{0,63}$"},
		{"future", validBody(t, map[string]string{"issued_at": `"2026-11-29T21:00:00Z"`}), ReasonIssuedInFuture, "issued_at: more than 5m ahead of the receiver's clock"},
		{"expired", validBody(t, map[string]string{"issued_at": `"2020-01-01T00:00:00Z"`}), ReasonExpired, "issued_at: older than the replay window"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := Parse(c.body)
			if err == nil {
				err = e.Validate(now, 0)
			}
			var got *Error
			if !errors.As(err, &got) || got.Reason != c.reason || got.Detail != c.detail {
				t.Fatalf("got %v, want %s: %s", err, c.reason, c.detail)
			}
		})
	}
	for _, c := range []struct {
		body, detail string
	}{
		{`[]`, "batch: must be an object"},
		{`{}`, "batch: envelopes: missing"},
		{`{"other":[]}`, "batch: unknown member"},
		{`{"envelopes":{}}`, "batch: envelopes: must be an array"},
		{`{"envelopes":[]}`, "batch: envelopes: must hold 1..100 items"},
		{`{"envelopes":[1],"envelopes":[1]}`, "batch: envelopes: duplicate member"},
		{`{"envelopes":[1} `, "batch: expected ',' or ']'"},
		{`{"envelopes":[1]} x`, "batch: data after the top-level value"},
		{`{"envelopes":[` + strings.Repeat("1,", 100) + `1]}`, "batch: envelopes: must hold 1..100 items"},
	} {
		_, err := SplitBatch([]byte(c.body))
		var got *Error
		if !errors.As(err, &got) || got.Reason != ReasonInvalidEnvelope || got.Detail != c.detail {
			t.Errorf("%s: got %v, want %s", c.body, err, c.detail)
		}
	}
	var e *Error
	_, err := SplitOutboxBatch([]byte(`{}`))
	if !errors.As(err, &e) || e.Detail != "batch: messages: missing" {
		t.Errorf("outbox wrapper: %v", err)
	}
	_, err = CanonicalizeWithLimits([]byte(`[[[]]]`), Limits{MaxDepth: 2})
	if !errors.As(err, &e) || e.Detail != "json: nesting deeper than 2" || !slices.Contains(KnownDetails(Limits{MaxDepth: 2}), e.Detail) {
		t.Errorf("tightened depth: %v", err)
	}
}

// A property of every refusal: whatever member names and values a body
// carries, the detail is one of the fixed sentences and quotes none of it.
func TestDetailsNeverQuoteTheRequest(t *testing.T) {
	rng := rand.New(rand.NewPCG(16, 811))
	const marker = "Zq7mark"
	token := func() string {
		alphabet := []string{marker, "a", "/", " ", "\\u00e9", "\\ud800", "é", "\x01", ".", "-", ":", "0", "9"}
		var b strings.Builder
		for range 1 + rng.IntN(6) {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	value := func() string {
		switch rng.IntN(7) {
		case 0:
			return `"` + token() + `"`
		case 1:
			return `{"` + token() + `":"` + token() + `"}`
		case 2:
			return `[` + `"` + token() + `"]`
		case 3:
			return "1" + strings.Repeat("0", rng.IntN(400))
		case 4:
			return `{"kind":"` + token() + `","` + token() + `":1}`
		case 5:
			return token()
		default:
			return `null`
		}
	}
	members := append(envelopeMembers[:], "metadata", "payload")
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	for i := range 5000 {
		over := map[string]string{}
		for range 1 + rng.IntN(3) {
			name := members[rng.IntN(len(members))]
			if rng.IntN(4) == 0 {
				name = token()
			}
			over[name] = value()
		}
		body := validBody(t, over)
		e, err := Parse(body)
		if err == nil {
			err = e.Validate(now, 0)
		}
		if err == nil {
			continue
		}
		requireKnownDetail(t, err)
		if strings.Contains(err.Error(), marker) {
			t.Fatalf("case %d: %v quotes the request", i, err)
		}
		_, err = SplitBatch([]byte(`{"envelopes":[` + string(body) + `],"` + token() + `":` + value() + `}`))
		if err != nil {
			requireKnownDetail(t, err)
			if strings.Contains(err.Error(), marker) {
				t.Fatalf("case %d: batch %v quotes the request", i, err)
			}
		}
	}
}
