package envelope

import (
	"strings"
	"testing"
)

func TestTighten(t *testing.T) {
	d := DefaultLimits()
	if d != (Limits{MaxBytes: 1 << 20, MaxDepth: 64, MaxItems: 10000}) {
		t.Fatalf("DefaultLimits = %+v", d)
	}
	cases := []struct{ o, want Limits }{
		{Limits{}, d},
		{Limits{MaxBytes: 10}, Limits{10, 64, 10000}},
		{Limits{MaxDepth: 3, MaxItems: 7}, Limits{1 << 20, 3, 7}},
		{Limits{MaxBytes: 2 << 20, MaxDepth: 1000, MaxItems: 1 << 30}, d}, // cannot loosen
		{Limits{MaxBytes: -1, MaxDepth: -5, MaxItems: 0}, d},              // cannot disable
	}
	for _, c := range cases {
		if got := d.Tighten(c.o); got != c.want {
			t.Errorf("Tighten(%+v) = %+v, want %+v", c.o, got, c.want)
		}
	}
}

func nestedArrays(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

func nestedObjects(n int) string {
	return strings.Repeat(`{"a":`, n-1) + "{}" + strings.Repeat("}", n-1)
}

func zeros(n int) string {
	if n == 0 {
		return "[]"
	}
	return "[" + strings.Repeat("0,", n-1) + "0]"
}

func members(n int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k`)
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(itoa(i))
		b.WriteString(`":0`)
	}
	b.WriteByte('}')
	return b.String()
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// wantLimit asserts that doc passes under l and that bigger fails with reason.
func wantLimit(t *testing.T, name string, l Limits, atLimit, overLimit string, reason Reason) {
	t.Helper()
	if _, err := CanonicalizeWithLimits([]byte(atLimit), l); err != nil {
		t.Errorf("%s: at the limit refused: %v", name, err)
	}
	_, err := CanonicalizeWithLimits([]byte(overLimit), l)
	if r, ok := ReasonOf(err); !ok || r != reason {
		t.Errorf("%s: limit+1 gave %v, want %s", name, err, reason)
	}
}

func TestLimitsAtTheEdge(t *testing.T) {
	def := Limits{}
	str := func(n int) string { return `"` + strings.Repeat("a", n-2) + `"` }
	wantLimit(t, "bytes default", def, str(1<<20), str(1<<20+1), ReasonBodyTooLarge)
	// White space counts: the limit is on the raw document.
	wantLimit(t, "bytes with white space", Limits{MaxBytes: 10}, "1"+strings.Repeat(" ", 9), "1"+strings.Repeat(" ", 10), ReasonBodyTooLarge)
	wantLimit(t, "bytes tightened", Limits{MaxBytes: 100}, str(100), str(101), ReasonBodyTooLarge)

	wantLimit(t, "depth arrays", def, nestedArrays(64), nestedArrays(65), ReasonInvalidEnvelope)
	wantLimit(t, "depth objects", def, nestedObjects(64), nestedObjects(65), ReasonInvalidEnvelope)
	wantLimit(t, "depth tightened", Limits{MaxDepth: 3}, nestedArrays(3), nestedArrays(4), ReasonInvalidEnvelope)
	wantLimit(t, "depth scalar adds none", Limits{MaxDepth: 1}, `[1,"a",null]`, `[[]]`, ReasonInvalidEnvelope)

	wantLimit(t, "items array", def, zeros(10000), zeros(10001), ReasonInvalidEnvelope)
	wantLimit(t, "items members", def, members(10000), members(10001), ReasonInvalidEnvelope)
	wantLimit(t, "items tightened", Limits{MaxItems: 5}, zeros(5), zeros(6), ReasonInvalidEnvelope)
	// Items add up over the whole document, containers and members alike.
	wantLimit(t, "items aggregate", Limits{MaxItems: 5}, `[[0,0],[0]]`, `[[0,0],{"a":0}, 1]`, ReasonInvalidEnvelope)
	wantLimit(t, "no items", Limits{MaxItems: 1}, `[[]]`, `[[0]]`, ReasonInvalidEnvelope)
}

func TestLimitsCannotBeLoosened(t *testing.T) {
	loose := Limits{MaxBytes: 4 << 20, MaxDepth: 1000, MaxItems: 1 << 20}
	if _, err := CanonicalizeWithLimits([]byte(nestedArrays(65)), loose); err == nil {
		t.Error("depth 65 accepted with a looser option")
	}
	if _, err := CanonicalizeWithLimits([]byte(zeros(10001)), loose); err == nil {
		t.Error("10001 items accepted with a looser option")
	}
	big := `"` + strings.Repeat("a", 1<<20) + `"`
	if _, err := CanonicalizeWithLimits([]byte(big), loose); err == nil {
		t.Error("more than 1 MiB accepted with a looser option")
	}
}

// The envelope itself counts: depth 1 for the envelope object and 13 items
// (12 members and metadata.kind) before the payload adds any.
func TestEnvelopeLimits(t *testing.T) {
	body := func(payload string) []byte { return validBody(t, map[string]string{"payload": payload}) }
	if _, err := Parse(body(nestedArrays(63))); err != nil {
		t.Fatalf("payload depth 63 (document depth 64) refused: %v", err)
	}
	if _, err := Parse(body(nestedArrays(64))); err == nil {
		t.Fatal("document depth 65 accepted")
	}
	if _, err := Parse(body(zeros(10000 - 13))); err != nil {
		t.Fatalf("10000 items refused: %v", err)
	}
	_, err := Parse(body(zeros(10000 - 12)))
	if r, _ := ReasonOf(err); r != ReasonInvalidEnvelope {
		t.Fatalf("10001 items: %v", err)
	}
	b := body(`"x"`)
	if _, err := ParseWithLimits(b, Limits{MaxBytes: len(b)}); err != nil {
		t.Fatalf("exact byte limit refused: %v", err)
	}
	_, err = ParseWithLimits(b, Limits{MaxBytes: len(b) - 1})
	if r, _ := ReasonOf(err); r != ReasonBodyTooLarge {
		t.Fatalf("byte limit - 1: %v", err)
	}
	_, err = Parse(body(`"` + strings.Repeat("a", 1<<20) + `"`))
	if r, _ := ReasonOf(err); r != ReasonBodyTooLarge {
		t.Fatalf("over 1 MiB: %v", err)
	}
	if _, err := ParseWithLimits(body(nestedArrays(2)), Limits{MaxDepth: 3}); err != nil {
		t.Fatalf("tightened depth at the limit refused: %v", err)
	}
	if _, err := ParseWithLimits(body(nestedArrays(3)), Limits{MaxDepth: 3}); err == nil {
		t.Fatal("tightened depth + 1 accepted")
	}
}
