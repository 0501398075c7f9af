package envelope

import (
	"strings"
	"testing"
)

func batchOf(items ...string) string {
	return `{"envelopes":[` + strings.Join(items, ",") + `]}`
}

func TestSplitBatch(t *testing.T) {
	env := string(validBody(t, nil))
	items, err := SplitBatch([]byte(" {\n\"envelopes\" : [ " + env + " ,\n" + env + " ] } \n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 2 || string(items[0]) != env || string(items[1]) != env {
		t.Fatalf("items %q", items)
	}
	for _, it := range items {
		if _, err := Parse(it); err != nil {
			t.Fatal(err)
		}
	}
	// An escaped spelling of the member name is the same name.
	if items, err := SplitBatch([]byte(`{"envelop\u0065s":[{}]}`)); err != nil || len(items) != 1 {
		t.Fatalf("escaped name: %v", err)
	}
	// Exactly MaxBatch is fine.
	hundred := make([]string, MaxBatch)
	for i := range hundred {
		hundred[i] = env
	}
	if items, err := SplitBatch([]byte(batchOf(hundred...))); err != nil || len(items) != MaxBatch {
		t.Fatalf("100 items: %d, %v", len(items), err)
	}
}

// Items are judged one by one: what is wrong inside an item is that item's
// own invalid_envelope, not the request's.
func TestSplitBatchItemsJudgedAlone(t *testing.T) {
	env := string(validBody(t, nil))
	odd := []string{
		`1`, `"x"`, `null`, `[]`, `true`,
		`{"a":1,"a":2}`,            // duplicate
		`[1e400]`,                  // out of range
		`"\ud800"`,                 // lone surrogate
		"\"\xff\"",                 // invalid UTF-8
		nestedArrays(200),          // too deep alone
		zeros(10001),               // too many items alone
		`{"x":"` + "\u0001" + `"}`, // raw control character
		string(validBody(t, map[string]string{"sequence": `0`})),
	}
	items, err := SplitBatch([]byte(batchOf(append([]string{env}, odd...)...)))
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != len(odd)+1 {
		t.Fatalf("%d items", len(items))
	}
	if _, err := Parse(items[0]); err != nil {
		t.Fatal(err)
	}
	for i, it := range items[1:] {
		if string(it) != odd[i] {
			t.Fatalf("item %d is %q, want %q", i, it, odd[i])
		}
		if r, _ := ReasonOf(parseErr(string(it))); r != ReasonInvalidEnvelope {
			t.Errorf("item %q: want invalid_envelope", it)
		}
	}
	// Depth and item limits are per envelope: 100 envelopes of 13 items each
	// exceed 10,000 together only if they were counted together (they are
	// not), and the wrapper's two levels do not count against an item.
	deep := string(validBody(t, map[string]string{"payload": nestedArrays(63)}))
	items, err = SplitBatch([]byte(batchOf(deep)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(items[0]); err != nil {
		t.Fatalf("depth-64 envelope inside a batch: %v", err)
	}
	big := string(validBody(t, map[string]string{"payload": zeros(10000 - 13)}))
	items, err = SplitBatch([]byte(batchOf(big, big)))
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if _, err := Parse(it); err != nil {
			t.Fatalf("10,000-item envelope inside a batch: %v", err)
		}
	}
}

func TestSplitBatchRefusals(t *testing.T) {
	env := string(validBody(t, nil))
	many := make([]string, MaxBatch+1)
	for i := range many {
		many[i] = `{}`
	}
	cases := []struct{ name, body string }{
		{"empty body", ``},
		{"array", `[` + env + `]`},
		{"null", `null`},
		{"empty object", `{}`},
		{"zero items", `{"envelopes":[]}`},
		{"101 items", batchOf(many...)},
		{"extra member", `{"envelopes":[{}],"x":1}`},
		{"extra member first", `{"x":1,"envelopes":[{}]}`},
		{"member case", `{"Envelopes":[{}]}`},
		{"duplicate member", `{"envelopes":[{}],"envelopes":[{}]}`},
		{"envelopes object", `{"envelopes":{}}`},
		{"envelopes null", `{"envelopes":null}`},
		{"trailing comma", `{"envelopes":[{},]}`},
		{"missing comma", `{"envelopes":[{} {}]}`},
		{"unbalanced item", `{"envelopes":[{]}`},
		{"unterminated item string", `{"envelopes":[{"a":"b]}`},
		{"broken item grammar", `{"envelopes":[{"a" 1}]}`},
		{"bad literal", `{"envelopes":[nul]}`},
		{"bad number", `{"envelopes":[01]}`},
		{"trailing data", `{"envelopes":[{}]} x`},
		{"unclosed wrapper", `{"envelopes":[{}]`},
		{"invalid UTF-8 name", "{\"\xff\":[{}]}"},
		{"lone surrogate name", `{"\ud800":[{}]}`},
	}
	for _, c := range cases {
		_, err := SplitBatch([]byte(c.body))
		if r, ok := ReasonOf(err); !ok || r != ReasonInvalidEnvelope {
			t.Errorf("%s: %v, want invalid_envelope", c.name, err)
		}
	}
	huge := `{"envelopes":["` + strings.Repeat("a", 1<<20) + `"]}`
	if r, _ := ReasonOf(errOf(SplitBatch([]byte(huge)))); r != ReasonBodyTooLarge {
		t.Error("over 1 MiB: want body_too_large")
	}
	atLimit := `{"envelopes":["` + strings.Repeat("a", 1<<20-len(`{"envelopes":[""]}`)) + `"]}`
	if _, err := SplitBatch([]byte(atLimit)); err != nil {
		t.Errorf("exactly 1 MiB: %v", err)
	}
}

func errOf(_ [][]byte, err error) error { return err }
