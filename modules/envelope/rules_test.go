package envelope

import (
	"strings"
	"testing"
)

func TestExportedRules(t *testing.T) {
	idOK := []string{"a", "A", "0", "a.b_c-d", strings.Repeat("x", 64)}
	idBad := []string{"", "-a", ".a", "_a", "a:b", "a b", "é", strings.Repeat("x", 65)}
	for _, s := range idOK {
		if !ValidIdentity(s) {
			t.Errorf("ValidIdentity(%q) = false", s)
		}
	}
	for _, s := range idBad {
		if ValidIdentity(s) {
			t.Errorf("ValidIdentity(%q) = true", s)
		}
	}
	if !ValidEventID("e:1") || !ValidEventID(strings.Repeat("e", 128)) || ValidEventID(strings.Repeat("e", 129)) || ValidEventID(":e") || ValidEventID("") {
		t.Error("ValidEventID")
	}
	if !ValidIdempotencyKey("!~") || !ValidIdempotencyKey(strings.Repeat("k", 255)) || ValidIdempotencyKey("") ||
		ValidIdempotencyKey(strings.Repeat("k", 256)) || ValidIdempotencyKey("a b") || ValidIdempotencyKey("a\x7f") {
		t.Error("ValidIdempotencyKey")
	}
	good := []Metadata{
		{Kind: "proposal"},
		{Kind: "a", CorrelationID: "c:1", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	for _, m := range good {
		if err := m.Validate(); err != nil {
			t.Errorf("%+v: %v", m, err)
		}
	}
	bad := []Metadata{
		{},
		{Kind: "Proposal"},
		{Kind: "a", CorrelationID: "c/1"},
		{Kind: "a", Traceparent: "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
	}
	for _, m := range bad {
		if r, _ := ReasonOf(m.Validate()); r != ReasonInvalidMetadata {
			t.Errorf("%+v: %v", m, m.Validate())
		}
	}
	// The exported check and the parse-time check agree.
	for _, m := range append(good, bad...) {
		e, err := Sign(Draft{TenantID: "t", ProjectID: "p", ProducerID: "d", EventID: "e", IdempotencyKey: "i",
			KeyID: "k", Sequence: 1, IssuedAt: vectorNow, Metadata: m, Payload: []byte(`{}`)}, vectorKey(t))
		if err != nil {
			t.Fatal(err)
		}
		r1, _ := ReasonOf(m.Validate())
		r2, _ := ReasonOf(e.Validate(vectorNow, 0))
		if r1 != r2 {
			t.Errorf("%+v: Metadata.Validate %q, Envelope.Validate %q", m, r1, r2)
		}
	}
}
