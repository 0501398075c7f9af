package envelope

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
)

// RFC 8785 section 3.2.2 (sample input and its canonical form).
func TestRFC8785Sample(t *testing.T) {
	in := `{
  "numbers": [333333333.33333329, 1E30, 4.50,
              2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`
	want := `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`
	got, err := Canonicalize([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

// RFC 8785 section 3.2.3: members sort by UTF-16 code units, so U+FB33
// sorts after U+1F600 (a surrogate pair starting 0xD83D).
func TestRFC8785Sorting(t *testing.T) {
	in := `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`
	want := "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"
	got, err := Canonicalize([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("\n got %s\nwant %s", got, want)
	}
}

// RFC 8785 appendix B: IEEE-754 bit patterns and their canonical text.
func TestRFC8785AppendixB(t *testing.T) {
	cases := []struct{ bits, want string }{
		{"0000000000000000", "0"},
		{"8000000000000000", "0"},
		{"0000000000000001", "5e-324"},
		{"8000000000000001", "-5e-324"},
		{"7fefffffffffffff", "1.7976931348623157e+308"},
		{"ffefffffffffffff", "-1.7976931348623157e+308"},
		{"4340000000000000", "9007199254740992"},
		{"c340000000000000", "-9007199254740992"},
		{"4430000000000000", "295147905179352830000"},
		{"44b52d02c7e14af5", "9.999999999999997e+22"},
		{"44b52d02c7e14af6", "1e+23"},
		{"44b52d02c7e14af7", "1.0000000000000001e+23"},
		{"444b1ae4d6e2ef4e", "999999999999999700000"},
		{"444b1ae4d6e2ef4f", "999999999999999900000"},
		{"444b1ae4d6e2ef50", "1e+21"},
		{"3eb0c6f7a0b5ed8c", "9.999999999999997e-7"},
		{"3eb0c6f7a0b5ed8d", "0.000001"},
		{"41b3de4355555553", "333333333.3333332"},
		{"41b3de4355555554", "333333333.33333325"},
		{"41b3de4355555555", "333333333.3333333"},
		{"41b3de4355555556", "333333333.3333334"},
		{"41b3de4355555557", "333333333.33333343"},
		{"becbf647612f3696", "-0.0000033333333333333333"},
		{"43143ff3c1cb0959", "1424953923781206.2"},
	}
	for _, c := range cases {
		checkNumber(t, c.bits, c.want)
	}
}

// checkNumber formats the double directly and also feeds Go's own text of it
// (different spelling, same value) through the reader.
func checkNumber(t *testing.T, hexBits, want string) {
	t.Helper()
	bits, err := strconv.ParseUint(hexBits, 16, 64)
	if err != nil {
		t.Fatalf("bad bits %q", hexBits)
	}
	f := math.Float64frombits(bits)
	if got := string(appendES6(nil, f)); got != want {
		t.Fatalf("%s: appendES6 = %s, want %s", hexBits, got, want)
	}
	got, err := Canonicalize([]byte(strconv.FormatFloat(f, 'g', -1, 64)))
	if err != nil || string(got) != want {
		t.Fatalf("%s: Canonicalize(%g) = %s, %v; want %s", hexBits, f, got, err, want)
	}
	again, err := Canonicalize([]byte(want))
	if err != nil || string(again) != want {
		t.Fatalf("%s: canonical text %s is not a fixed point: %s, %v", hexBits, want, again, err)
	}
}

// testdata/es6-numbers.txt.gz comes from testdata/gen-es6-numbers.js: the
// expected text is Node.js String(number), the ECMAScript algorithm RFC 8785
// adopts.
func TestES6NumbersFromNode(t *testing.T) {
	f, err := os.Open("testdata/es6-numbers.txt.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	n := 0
	for sc.Scan() {
		hexBits, want, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			t.Fatalf("line %d malformed", n+1)
		}
		checkNumber(t, hexBits, want)
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n < 100000 {
		t.Fatalf("only %d numbers checked", n)
	}
}

func TestCanonicalizeForms(t *testing.T) {
	cases := []struct{ in, want string }{
		{`-0`, `0`},
		{`-0.0`, `0`},
		{`[-0, 0e0, -0e-5]`, `[0,0,0]`},
		{`1.0`, `1`},
		{`1E2`, `100`},
		{`1e20`, `100000000000000000000`},
		{`1e21`, `1e+21`},
		{`1e-7`, `1e-7`},
		{`0.000001`, `0.000001`},
		{`9007199254740993`, `9007199254740992`},
		{`123456789012345678901234567890`, `1.2345678901234568e+29`},
		{`1e-400`, `0`}, // underflow rounds, as ECMAScript's JSON.parse does
		{`"\u00e9\/\b\f\n\r\t\u0001\u001f\u007f"`, "\"é/\\b\\f\\n\\r\\t\\u0001\\u001f\u007f\""},
		{`"\uD83D\uDE00"`, `"😀"`},
		{`"\u2028"`, "\"\u2028\""},
		{"  {\"b\" : [ true , false , null ] , \"a\" : {} }\r\n", `{"a":{},"b":[true,false,null]}`},
		{`{"a":{"d":1,"c":2},"b":[{"z":0,"y":1}]}`, `{"a":{"c":2,"d":1},"b":[{"y":1,"z":0}]}`},
		{`{"\n":1,"\\":2," ":3}`, `{"\n":1," ":3,"\\":2}`},
		{`{"\u0041":1,"B":2}`, `{"A":1,"B":2}`},
		{`"x"`, `"x"`},
		{`[]`, `[]`},
	}
	for _, c := range cases {
		got, err := Canonicalize([]byte(c.in))
		if err != nil {
			t.Errorf("Canonicalize(%q): %v", c.in, err)
			continue
		}
		if string(got) != c.want {
			t.Errorf("Canonicalize(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestReaderRefusals(t *testing.T) {
	cases := []struct{ name, in string }{
		{"empty", ``},
		{"white space only", " \n"},
		{"duplicate member", `{"a":1,"a":2}`},
		{"duplicate member after sorting", `{"b":1,"a":2,"b":3}`},
		{"duplicate via escape", `{"a":1,"\u0061":2}`},
		{"nested duplicate", `{"x":[{"k":1,"k":1}]}`},
		{"invalid UTF-8", "\"\xff\""},
		{"overlong UTF-8", "\"\xc0\xaf\""},
		{"UTF-8 surrogate", "\"\xed\xa0\x80\""},
		{"truncated UTF-8", "\"\xe2\x82\""},
		{"invalid UTF-8 in key", "{\"\xff\":1}"},
		{"lone high surrogate", `"\ud800"`},
		{"lone high surrogate then text", `"\ud800abcdef"`},
		{"lone low surrogate", `"\udc00"`},
		{"high then high", `"\ud800\ud800"`},
		{"bad escape", `"\x41"`},
		{"short unicode escape", `"\u12"`},
		{"non-hex unicode escape", `"\u12g4"`},
		{"raw control char", "\"a\tb\""},
		{"raw newline", "\"a\nb\""},
		{"unterminated string", `"abc`},
		{"overflow", `1e400`},
		{"negative overflow", `-1e400`},
		{"long overflow", `[` + strings.Repeat("9", 400) + `]`},
		{"NaN", `NaN`},
		{"Infinity", `Infinity`},
		{"leading zero", `01`},
		{"leading plus", `+1`},
		{"bare minus", `-`},
		{"dot without digits", `1.`},
		{"leading dot", `.5`},
		{"exponent without digits", `1e`},
		{"exponent sign only", `1e+`},
		{"hex", `0x10`},
		{"trailing comma array", `[1,]`},
		{"trailing comma object", `{"a":1,}`},
		{"missing colon", `{"a" 1}`},
		{"unquoted key", `{a:1}`},
		{"single quotes", `'a'`},
		{"two values", `1 2`},
		{"trailing garbage", `{} x`},
		{"unclosed object", `{"a":1`},
		{"unclosed array", `[1`},
		{"mismatched", `[1}`},
		{"BOM", "\xef\xbb\xbf{}"},
		{"comment", `{} // x`},
		{"bad literal", `tru`},
		{"capital literal", `True`},
		{"vertical tab white space", "\v1"},
		{"NUL white space", "\x001"},
	}
	for _, c := range cases {
		_, err := Canonicalize([]byte(c.in))
		if r, ok := ReasonOf(err); !ok || r != ReasonInvalidEnvelope {
			t.Errorf("%s: Canonicalize(%q) err = %v, want invalid_envelope", c.name, c.in, err)
		}
	}
}

// encoding/json is the obvious alternative and is unfit here: it merges
// duplicate names (last wins) and matches struct fields case-insensitively,
// so two different byte strings would carry "the same" envelope. This test
// pins both behaviours and shows the reader refuses what json accepts.
func TestStricterThanEncodingJSON(t *testing.T) {
	var v struct{ Sequence int }
	if err := json.Unmarshal([]byte(`{"Sequence":1,"sequence":2}`), &v); err != nil || v.Sequence != 2 {
		t.Fatalf("encoding/json changed: %v %+v", err, v)
	}
	var m map[string]int
	if err := json.Unmarshal([]byte(`{"a":1,"a":2}`), &m); err != nil || m["a"] != 2 {
		t.Fatalf("encoding/json changed: %v %v", err, m)
	}
	if _, err := Canonicalize([]byte(`{"a":1,"a":2}`)); err == nil {
		t.Fatal("duplicate member accepted")
	}
	// Case matters: "Sequence" and "sequence" are two members, not one.
	got, err := Canonicalize([]byte(`{"sequence":2,"Sequence":1}`))
	if err != nil || string(got) != `{"Sequence":1,"sequence":2}` {
		t.Fatalf("got %s, %v", got, err)
	}
	// encoding/json also lets invalid UTF-8 through (replacing it).
	var s string
	if err := json.Unmarshal([]byte("\"\xff\""), &s); err != nil {
		t.Fatalf("encoding/json changed: %v", err)
	}
	if _, err := Canonicalize([]byte("\"\xff\"")); err == nil {
		t.Fatal("invalid UTF-8 accepted")
	}
}

func TestCanonicalizeIdempotentAndStable(t *testing.T) {
	docs := []string{
		`{"z":[1,2.50,{"b":null,"a":"\u00e9"}],"a":-1,"m":{"\ud83d\ude00":1,"\uffff":2}}`,
		`[1e21,1e-7,123e-20,"\t\"",{}]`,
	}
	vf := loadVectors(t)
	for _, v := range vf.Vectors {
		docs = append(docs, v.Body)
	}
	for _, d := range docs {
		once, err := Canonicalize([]byte(d))
		if err != nil {
			t.Fatal(err)
		}
		twice, err := Canonicalize(once)
		if err != nil || string(twice) != string(once) {
			t.Fatalf("not idempotent: %s -> %s (%v)", once, twice, err)
		}
		// The canonical form is JSON that means the same thing.
		var a, b any
		if json.Unmarshal([]byte(d), &a) != nil || json.Unmarshal(once, &b) != nil {
			t.Fatal("encoding/json cannot read it")
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Fatalf("meaning changed: %s vs %s", ja, jb)
		}
	}
}

func TestCompareUTF16(t *testing.T) {
	ordered := []string{"", "\r", "1", "A", "a", "ab", "\u0080", "ö", "€", "\ud7ff", "😀", "😁", "\ue000", "\ufb33", "\uffff"}
	for i := range ordered {
		for j := range ordered {
			c := compareUTF16([]byte(ordered[i]), []byte(ordered[j]))
			if (i < j) != (c < 0) || (i == j) != (c == 0) {
				t.Fatalf("compare(%q, %q) = %d", ordered[i], ordered[j], c)
			}
		}
	}
}
