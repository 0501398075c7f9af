package envelope

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// A second, deliberately naive canonicalizer over a generated value tree:
// it shares nothing with the reader except the number formatter, which is
// checked separately against Node.js. Random documents rendered with random
// white space, member order and escapes must canonicalize to its output.

type jsonMember struct {
	key string
	val any
}

type jsonObject []jsonMember

func refCanonical(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return strconv.FormatBool(x)
	case float64:
		return string(appendES6(nil, x))
	case string:
		return refString(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = refCanonical(e)
		}
		return "[" + strings.Join(parts, ",") + "]"
	case jsonObject:
		ms := slices.Clone(x)
		slices.SortFunc(ms, func(a, b jsonMember) int {
			return slices.Compare(utf16.Encode([]rune(a.key)), utf16.Encode([]rune(b.key)))
		})
		parts := make([]string, len(ms))
		for i, m := range ms {
			parts[i] = refString(m.key) + ":" + refCanonical(m.val)
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	panic(fmt.Sprintf("unexpected %T", v))
}

func refString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

type gen struct{ r *rand.Rand }

var runePool = []rune{'a', 'Z', '0', ' ', '"', '\\', '/', '\n', '\t', 0, 0x1f, 0x7f, 0x80, 'é', '€', 0x2028,
	0xd7ff, 0xe000, 0xfb33, 0xffff, 0x10000, 0x1f600, 0x10ffff}

func (g gen) str() string {
	n := g.r.IntN(6)
	rs := make([]rune, n)
	for i := range rs {
		rs[i] = runePool[g.r.IntN(len(runePool))]
	}
	return string(rs)
}

func (g gen) value(depth int) any {
	k := g.r.IntN(8)
	if depth > 4 {
		k = g.r.IntN(4)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return g.r.IntN(2) == 0
	case 2:
		return g.str()
	case 3:
		for {
			f := math.Float64frombits(g.r.Uint64())
			if g.r.IntN(2) == 0 {
				f = float64(g.r.IntN(2000)-1000) / float64(1+g.r.IntN(64))
			}
			if !math.IsNaN(f) && !math.IsInf(f, 0) {
				return f
			}
		}
	case 4, 5:
		a := make([]any, g.r.IntN(5))
		for i := range a {
			a[i] = g.value(depth + 1)
		}
		return a
	default:
		var o jsonObject
		seen := map[string]bool{}
		for range g.r.IntN(6) {
			k := g.str()
			if seen[k] {
				continue
			}
			seen[k] = true
			o = append(o, jsonMember{k, g.value(depth + 1)})
		}
		return o
	}
}

func (g gen) ws() string {
	return [...]string{"", "", " ", "\n", "\t", "\r\n  "}[g.r.IntN(6)]
}

// render writes v in a random legal spelling.
func (g gen) render(b *strings.Builder, v any) {
	b.WriteString(g.ws())
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case float64:
		switch g.r.IntN(3) {
		case 0:
			b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
		case 1:
			b.WriteString(strings.ToUpper(strconv.FormatFloat(x, 'e', 20, 64)))
		default:
			if math.Abs(x) < 1e30 && math.Abs(x) > 1e-30 || x == 0 {
				b.WriteString(strconv.FormatFloat(x, 'f', -1, 64))
			} else {
				b.WriteString(strconv.FormatFloat(x, 'e', -1, 64))
			}
		}
	case string:
		g.renderString(b, x)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(g.ws() + ",")
			}
			g.render(b, e)
		}
		b.WriteString(g.ws() + "]")
	case jsonObject:
		ms := slices.Clone(x)
		g.r.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		b.WriteByte('{')
		for i, m := range ms {
			if i > 0 {
				b.WriteString(g.ws() + ",")
			}
			b.WriteString(g.ws())
			g.renderString(b, m.key)
			b.WriteString(g.ws() + ":")
			g.render(b, m.val)
		}
		b.WriteString(g.ws() + "}")
	}
	b.WriteString(g.ws())
}

func (g gen) renderString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		mustEscape := r < 0x20 || r == '"' || r == '\\'
		if !mustEscape && g.r.IntN(3) != 0 {
			b.WriteRune(r)
			continue
		}
		if r >= 0x10000 {
			hi, lo := utf16.EncodeRune(r)
			fmt.Fprintf(b, `\u%04X\u%04x`, hi, lo)
			continue
		}
		switch {
		case r == '/' && g.r.IntN(2) == 0:
			b.WriteString(`\/`)
		case r == '"' && g.r.IntN(2) == 0:
			b.WriteString(`\"`)
		case r == '\n' && g.r.IntN(2) == 0:
			b.WriteString(`\n`)
		default:
			fmt.Fprintf(b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
}

func TestCanonicalizeMatchesReference(t *testing.T) {
	g := gen{rand.New(rand.NewPCG(8785, 1))}
	for i := range 20000 {
		v := g.value(0)
		var b strings.Builder
		g.render(&b, v)
		want := refCanonical(v)
		got, err := Canonicalize([]byte(b.String()))
		if err != nil {
			t.Fatalf("case %d: Canonicalize(%q): %v", i, b.String(), err)
		}
		if string(got) != want {
			t.Fatalf("case %d: Canonicalize(%q)\n got %q\nwant %q", i, b.String(), got, want)
		}
		if !utf8.Valid(got) {
			t.Fatalf("case %d: output is not UTF-8", i)
		}
		again, err := Canonicalize(got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("case %d: not idempotent", i)
		}
	}
}

// parse -> canonical -> parse is stable, and the signing input is the
// reference canonical form of the envelope without its signature.
func TestParseCanonicalParseStable(t *testing.T) {
	g := gen{rand.New(rand.NewPCG(8032, 2))}
	for i := range 3000 {
		payload := g.value(1)
		var pb strings.Builder
		g.render(&pb, payload)
		body := validBody(t, map[string]string{"payload": pb.String()})
		e, err := Parse(body)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		env := jsonObject{
			{"schema_version", 1.0}, {"tenant_id", "tenant-a"}, {"project_id", "proj-1"},
			{"producer_id", "device-7"}, {"event_id", "evt-1"}, {"idempotency_key", "idem-1"},
			{"key_id", "k1"}, {"sequence", 1.0}, {"issued_at", "2026-11-29T20:00:00Z"},
			{"metadata", jsonObject{{"kind", "task.status"}}}, {"payload", payload},
		}
		if want := SigningPrefix + refCanonical(env); string(e.SigningInput()) != want {
			t.Fatalf("case %d: signing input\n got %q\nwant %q", i, e.SigningInput(), want)
		}
		if string(e.Payload) != refCanonical(payload) {
			t.Fatalf("case %d: payload %q", i, e.Payload)
		}
		e2, err := Parse(e.Canonical())
		if err != nil || !bytes.Equal(e2.Canonical(), e.Canonical()) || !bytes.Equal(e2.SigningInput(), e.SigningInput()) {
			t.Fatalf("case %d: unstable (%v)", i, err)
		}
	}
}
