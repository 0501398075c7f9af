package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

// Seeds live in testdata/fuzz/<FuzzName>/ (the go test fuzz v1 format) and
// run as regular tests; `go test -fuzz=FuzzX` explores from them.

// FuzzCanonicalize checks, for any input, that the reader does not panic,
// that whatever it accepts encoding/json also accepts with the same meaning,
// and that its output is a fixed point.
func FuzzCanonicalize(f *testing.F) {
	f.Add([]byte(`{"b":[1,2.5e-7,"\u00e9"],"a":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := Canonicalize(data)
		if err != nil {
			if _, ok := ReasonOf(err); !ok {
				t.Fatalf("error without a reason: %v", err)
			}
			requireKnownDetail(t, err)
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted what encoding/json calls invalid: %q", data)
		}
		again, err := Canonicalize(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not a fixed point: %q -> %q -> %q (%v)", data, out, again, err)
		}
		var a, b any
		if json.Unmarshal(data, &a) != nil || json.Unmarshal(out, &b) != nil {
			t.Fatalf("encoding/json cannot read %q or %q", data, out)
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		// encoding/json keeps -0 as -0 where JCS writes 0; compare after
		// canonicalizing both renderings.
		ca, _ := Canonicalize(ja)
		cb, _ := Canonicalize(jb)
		if !bytes.Equal(ca, cb) {
			t.Fatalf("meaning changed: %s vs %s", ja, jb)
		}
	})
}

// FuzzParse checks that Parse never panics, that every refusal carries a
// reason, and that an accepted envelope round-trips through its stored form.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := Parse(data)
		if err != nil {
			if _, ok := ReasonOf(err); !ok {
				t.Fatalf("error without a reason: %v", err)
			}
			requireKnownDetail(t, err)
			return
		}
		e2, err := Parse(e.Canonical())
		if err != nil {
			t.Fatalf("stored form does not parse: %v", err)
		}
		if !bytes.Equal(e2.SigningInput(), e.SigningInput()) || !bytes.Equal(e2.Canonical(), e.Canonical()) ||
			e2.EventIdentity() != e.EventIdentity() || e2.Metadata != e.Metadata {
			t.Fatal("parse -> canonical -> parse is not stable")
		}
		// Steps 3 and 4 must not panic either.
		if err := e.Verify(make([]byte, 32)); err != nil && !errors.Is(err, ErrInvalidPublicKey) {
			requireKnownDetail(t, err)
		}
		if err := e.Validate(time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC), 0); err != nil {
			requireKnownDetail(t, err)
		}
	})
}

// FuzzSplitBatch checks that SplitBatch never panics and that each item it
// returns is a sub-slice of the body.
func FuzzSplitBatch(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		items, err := SplitBatch(data)
		if err != nil {
			if _, ok := ReasonOf(err); !ok {
				t.Fatalf("error without a reason: %v", err)
			}
			requireKnownDetail(t, err)
			return
		}
		if len(items) < 1 || len(items) > MaxBatch {
			t.Fatalf("%d items", len(items))
		}
		// Items are only grammar-checked here; content faults (raw control
		// characters, bad UTF-8, ...) are each item's own refusal. So a body
		// that is not valid JSON must contain an item the strict reader refuses.
		someRefused := false
		for _, it := range items {
			if !bytes.Contains(data, it) {
				t.Fatalf("item %q is not part of the body", it)
			}
			if _, err := Canonicalize(it); err != nil {
				someRefused = true
			}
			_, _ = Parse(it)
		}
		if !json.Valid(data) && !someRefused {
			t.Fatalf("invalid body %q accepted with only valid items", data)
		}
		// Splitting the re-assembled wrapper gives the same items.
		again, err := SplitBatch([]byte(`{"envelopes":[` + string(bytes.Join(items, []byte(","))) + `]}`))
		if err != nil || len(again) != len(items) {
			t.Fatalf("re-assembled batch: %d items, %v", len(again), err)
		}
		for i := range items {
			if !bytes.Equal(again[i], items[i]) {
				t.Fatalf("item %d changed: %q -> %q", i, items[i], again[i])
			}
		}
	})
}

// FuzzSplitOutboxBatch checks that SplitOutboxBatch never panics, that it
// answers every malformed wrapper with a reason, and that it accepts exactly
// the wrappers SplitBatch accepts once the member is renamed: one parser,
// two member names.
func FuzzSplitOutboxBatch(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		items, err := SplitOutboxBatch(data)
		if err != nil {
			if _, ok := ReasonOf(err); !ok {
				t.Fatalf("error without a reason: %v", err)
			}
			requireKnownDetail(t, err)
			return
		}
		if len(items) < 1 || len(items) > MaxBatch {
			t.Fatalf("%d items", len(items))
		}
		for _, it := range items {
			if !bytes.Contains(data, it) {
				t.Fatalf("item %q is not part of the body", it)
			}
		}
		joined := string(bytes.Join(items, []byte(",")))
		again, err := SplitOutboxBatch([]byte(`{"messages":[` + joined + `]}`))
		if err != nil || len(again) != len(items) {
			t.Fatalf("re-assembled batch: %d items, %v", len(again), err)
		}
		if env, err := SplitBatch([]byte(`{"envelopes":[` + joined + `]}`)); err != nil || len(env) != len(items) {
			t.Fatalf("the same items as an envelope batch: %d items, %v", len(env), err)
		}
		if _, err := SplitBatch(data); err == nil {
			t.Fatalf("body %q is both an outbox and an envelope batch", data)
		}
	})
}
