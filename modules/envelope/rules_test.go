package envelope

import (
	"regexp"
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

// The patterns other layers quote and the byte checks that apply them say
// the same thing, so quoting a pattern never promises another rule.
func TestPatternsAreTheChecks(t *testing.T) {
	idRE, eventRE := regexp.MustCompile(IdentityPattern), regexp.MustCompile(EventIDPattern)
	inputs := []string{"", "a", "A9", "a.b_c-d", "a:b", ":a", "-a", "a b", "a\n", "\na", "é", "aé",
		strings.Repeat("x", 63), strings.Repeat("x", 64), strings.Repeat("x", 65),
		strings.Repeat("e", 127), strings.Repeat("e", 128), strings.Repeat("e", 129), "e:" + strings.Repeat("1", 126)}
	for _, s := range inputs {
		if got, want := ValidIdentity(s), idRE.MatchString(s); got != want {
			t.Errorf("ValidIdentity(%q) = %v, pattern %v", s, got, want)
		}
		if got, want := ValidEventID(s), eventRE.MatchString(s); got != want {
			t.Errorf("ValidEventID(%q) = %v, pattern %v", s, got, want)
		}
	}
}

func FuzzPatternsAreTheChecks(f *testing.F) {
	idRE, eventRE := regexp.MustCompile(IdentityPattern), regexp.MustCompile(EventIDPattern)
	for _, s := range []string{"a", "a:b", "-a", strings.Repeat("x", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidIdentity(s) != idRE.MatchString(s) || ValidEventID(s) != eventRE.MatchString(s) {
			t.Errorf("%q: checks and patterns disagree", s)
		}
	})
}
