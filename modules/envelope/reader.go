package envelope

import (
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// The reader is a single-pass, byte-level JSON parser that writes the RFC 8785
// canonical form while it reads. It never builds a tree of values: strings and
// numbers are re-encoded straight into the output buffer, and an object's
// members are only reordered (by copying byte ranges) when they arrive out of
// canonical order. Limits are checked as each container opens and each item
// is counted, so a hostile document is refused at the first byte that breaks a
// rule instead of after it has been materialised.

type valueKind uint8

const (
	kindNull valueKind = iota + 1
	kindBool
	kindNumber
	kindString
	kindObject
	kindArray
)

// member records one object member by offsets into the output (and, for
// numbers, into the input) so that reordering is a copy of byte ranges and
// the envelope code can inspect top-level values without a second parse.
type member struct {
	keyOff, keyLen int // decoded key: in out, or in keys when keyInBuf
	start, end     int // `"key":value` in out
	val            int // start of the value in out
	rawStart       int // number lexeme in the input
	rawEnd         int
	kind           valueKind
	keyInBuf       bool
	intLexeme      bool // number written without fraction or exponent
}

type reader struct {
	in    []byte
	pos   int
	out   []byte
	lim   Limits
	depth int
	items int

	members []member // stack: each open object owns members[base:]
	keys    []byte   // decoded keys whose canonical form needed escapes
	scratch []byte   // copy of an object's body while it is reordered

	keepTop bool // leave the top-level object's members in members
}

var readerPool = sync.Pool{New: func() any { return new(reader) }}

// Scratch buffers larger than these are dropped rather than pooled so one
// huge document does not pin its memory for the life of the process.
const (
	maxPooledScratch = 64 << 10
	maxPooledMembers = 1024
)

func getReader(in []byte, lim Limits, keepTop bool) *reader {
	r := readerPool.Get().(*reader)
	r.in, r.pos, r.lim, r.depth, r.items, r.keepTop = in, 0, lim, 0, 0, keepTop
	r.members, r.keys, r.scratch = r.members[:0], r.keys[:0], r.scratch[:0]
	r.out = nil
	return r
}

func putReader(r *reader) {
	r.in, r.out = nil, nil
	if cap(r.members) > maxPooledMembers || cap(r.keys) > maxPooledScratch || cap(r.scratch) > maxPooledScratch {
		return
	}
	readerPool.Put(r)
}

// Canonicalize returns the RFC 8785 (JCS) form of data under the contract's
// default limits. It refuses, with an *Error, everything the contract refuses:
// more than MaxBytes (body_too_large), and as invalid_envelope malformed JSON,
// depth or item overflow, duplicate member names, invalid UTF-8, lone
// surrogates and numbers beyond the IEEE-754 double range.
func Canonicalize(data []byte) ([]byte, error) {
	return CanonicalizeWithLimits(data, Limits{})
}

// CanonicalizeWithLimits is Canonicalize with limits tightened by l (see
// Limits.Tighten: zero fields keep the default, nothing can loosen it).
func CanonicalizeWithLimits(data []byte, l Limits) ([]byte, error) {
	r := getReader(data, effective(l), false)
	defer putReader(r)
	if err := r.run(); err != nil {
		return nil, err
	}
	return r.out, nil
}

func (r *reader) run() error {
	if len(r.in) > r.lim.MaxBytes {
		return &Error{Reason: ReasonBodyTooLarge, Detail: BodyTooLargeDetail(r.lim.MaxBytes)}
	}
	// The canonical form is rarely longer than the input; numbers such as
	// 1e20 are the exception and append grows for them.
	r.out = make([]byte, 0, len(r.in))
	r.skipWS()
	if r.pos >= len(r.in) {
		return invalidJSON(synEmpty)
	}
	if _, err := r.value(); err != nil {
		return err
	}
	r.skipWS()
	if r.pos != len(r.in) {
		return invalidJSON(synTrailing)
	}
	return nil
}

func (r *reader) skipWS() {
	for r.pos < len(r.in) {
		switch r.in[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

func (r *reader) value() (valueKind, error) {
	if r.pos >= len(r.in) {
		return 0, invalidJSON(synEnd)
	}
	switch c := r.in[r.pos]; {
	case c == '{':
		return kindObject, r.object()
	case c == '[':
		return kindArray, r.array()
	case c == '"':
		_, err := r.str()
		return kindString, err
	case c == '-' || (c >= '0' && c <= '9'):
		_, _, err := r.number()
		return kindNumber, err
	case c == 't':
		return kindBool, r.literal("true")
	case c == 'f':
		return kindBool, r.literal("false")
	case c == 'n':
		return kindNull, r.literal("null")
	default:
		return 0, invalidJSON(synChar)
	}
}

func (r *reader) literal(lit string) error {
	if len(r.in)-r.pos < len(lit) || string(r.in[r.pos:r.pos+len(lit)]) != lit {
		return invalidJSON(synLiteral)
	}
	r.out = append(r.out, lit...)
	r.pos += len(lit)
	return nil
}

func (r *reader) enter() error {
	r.depth++
	if r.depth > r.lim.MaxDepth {
		return invalid(depthDetail(r.lim.MaxDepth))
	}
	return nil
}

func (r *reader) count() error {
	r.items++
	if r.items > r.lim.MaxItems {
		return invalid(itemsDetail(r.lim.MaxItems))
	}
	return nil
}

func (r *reader) array() error {
	if err := r.enter(); err != nil {
		return err
	}
	r.pos++
	r.out = append(r.out, '[')
	r.skipWS()
	if r.pos < len(r.in) && r.in[r.pos] == ']' {
		r.pos++
		r.out = append(r.out, ']')
		r.depth--
		return nil
	}
	for {
		if err := r.count(); err != nil {
			return err
		}
		if _, err := r.value(); err != nil {
			return err
		}
		r.skipWS()
		if r.pos >= len(r.in) {
			return invalidJSON(synUnterminatedArr)
		}
		switch r.in[r.pos] {
		case ',':
			r.pos++
			r.out = append(r.out, ',')
			r.skipWS()
		case ']':
			r.pos++
			r.out = append(r.out, ']')
			r.depth--
			return nil
		default:
			return invalidJSON(synArraySep)
		}
	}
}

func (r *reader) object() error {
	if err := r.enter(); err != nil {
		return err
	}
	objPos := r.pos
	r.pos++
	r.out = append(r.out, '{')
	bodyStart := len(r.out)
	base, keysBase := len(r.members), len(r.keys)
	r.skipWS()
	if r.pos < len(r.in) && r.in[r.pos] == '}' {
		r.pos++
		r.out = append(r.out, '}')
		r.depth--
		return nil
	}
	for {
		if r.pos >= len(r.in) || r.in[r.pos] != '"' {
			return invalidJSON(synMemberName)
		}
		if err := r.count(); err != nil {
			return err
		}
		var m member
		m.start = len(r.out)
		escaped, err := r.str()
		if err != nil {
			return err
		}
		if escaped {
			// Compare and sort on the decoded name, which the canonical
			// escaping would otherwise distort ("\n" sorts as 0x0A, not '\').
			m.keyInBuf, m.keyOff = true, len(r.keys)
			r.keys = unescapeCanonical(r.keys, r.out[m.start+1:len(r.out)-1])
			m.keyLen = len(r.keys) - m.keyOff
		} else {
			m.keyOff, m.keyLen = m.start+1, len(r.out)-m.start-2
		}
		r.skipWS()
		if r.pos >= len(r.in) || r.in[r.pos] != ':' {
			return invalidJSON(synColon)
		}
		r.pos++
		r.out = append(r.out, ':')
		r.skipWS()
		m.val = len(r.out)
		if r.pos < len(r.in) && (r.in[r.pos] == '-' || (r.in[r.pos] >= '0' && r.in[r.pos] <= '9')) {
			m.kind = kindNumber
			m.rawStart = r.pos
			if m.intLexeme, _, err = r.number(); err != nil {
				return err
			}
			m.rawEnd = r.pos
		} else if m.kind, err = r.value(); err != nil {
			return err
		}
		m.end = len(r.out)
		r.members = append(r.members, m)
		r.skipWS()
		if r.pos >= len(r.in) {
			return invalidJSON(synUnterminatedObj)
		}
		switch r.in[r.pos] {
		case ',':
			r.pos++
			r.out = append(r.out, ',')
			r.skipWS()
			continue
		case '}':
			r.pos++
		default:
			return invalidJSON(synObjectSep)
		}
		break
	}
	if err := r.order(base, bodyStart, objPos); err != nil {
		return err
	}
	r.out = append(r.out, '}')
	r.depth--
	if r.depth > 0 || !r.keepTop {
		r.members = r.members[:base]
		r.keys = r.keys[:keysBase]
	}
	return nil
}

func (r *reader) key(m *member) []byte {
	if m.keyInBuf {
		return r.keys[m.keyOff : m.keyOff+m.keyLen]
	}
	return r.out[m.keyOff : m.keyOff+m.keyLen]
}

// order puts the members of the object whose body starts at bodyStart into
// RFC 8785 order and refuses duplicate names. Documents written by canonical
// producers are already ordered, which costs one comparison per member.
func (r *reader) order(base, bodyStart, objPos int) error {
	ms := r.members[base:]
	sorted := true
	for i := 1; i < len(ms); i++ {
		c := compareUTF16(r.key(&ms[i-1]), r.key(&ms[i]))
		if c == 0 {
			return invalidJSON(synDuplicateMember)
		}
		if c > 0 {
			sorted = false
		}
	}
	if sorted {
		return nil
	}
	slices.SortFunc(ms, func(a, b member) int { return compareUTF16(r.key(&a), r.key(&b)) })
	for i := 1; i < len(ms); i++ {
		if compareUTF16(r.key(&ms[i-1]), r.key(&ms[i])) == 0 {
			return invalidJSON(synDuplicateMember)
		}
	}
	r.scratch = append(r.scratch[:0], r.out[bodyStart:]...)
	w := bodyStart
	for i := range ms {
		m := &ms[i]
		if i > 0 {
			r.out[w] = ','
			w++
		}
		n := copy(r.out[w:], r.scratch[m.start-bodyStart:m.end-bodyStart])
		delta := w - m.start
		m.start += delta
		m.end += delta
		m.val += delta
		if !m.keyInBuf {
			m.keyOff += delta
		}
		w += n
	}
	return nil
}

// compareUTF16 orders decoded member names by their UTF-16 code units, as
// RFC 8785 section 3.2.3 requires. UTF-8 byte order equals code point order,
// which differs from UTF-16 order only between U+E000..U+FFFF and the
// supplementary planes (encoded as surrogates 0xD800..0xDFFF in UTF-16), so
// the first differing byte decides in every other case.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	x, y := a[i], b[i]
	// Lead bytes 0xEE/0xEF start U+E000..U+FFFF; 0xF0..0xF4 start U+10000+.
	// A differing continuation byte shares its lead byte, so it never gets here.
	if x >= 0xEE && y >= 0xEE && (x >= 0xF0) != (y >= 0xF0) {
		if x >= 0xF0 {
			return -1
		}
		return 1
	}
	return int(x) - int(y)
}

// strSafe marks ASCII bytes that are copied verbatim into a canonical string.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str reads the string at r.pos and writes its canonical form. escaped
// reports whether that form contains a backslash, i.e. whether it differs from
// the decoded string.
func (r *reader) str() (escaped bool, err error) {
	in := r.in
	i := r.pos + 1
	start := i
	r.out = append(r.out, '"')
	for {
		for i < len(in) && strSafe[in[i]] {
			i++
		}
		if i >= len(in) {
			return false, invalidJSON(synUnterminatedStr)
		}
		c := in[i]
		switch {
		case c == '"':
			r.out = append(r.out, in[start:i]...)
			r.out = append(r.out, '"')
			r.pos = i + 1
			return escaped, nil
		case c == '\\':
			r.out = append(r.out, in[start:i]...)
			n, esc, err := r.escape(i)
			if err != nil {
				return false, err
			}
			escaped = escaped || esc
			i += n
			start = i
		case c < 0x20:
			return false, invalidJSON(synControl)
		default:
			rn, size := utf8.DecodeRune(in[i:])
			if rn == utf8.RuneError && size <= 1 {
				return false, invalidJSON(synUTF8)
			}
			i += size
		}
	}
}

// escape decodes the escape sequence at in[i] and writes the canonical form
// of the character. It returns the input length consumed.
func (r *reader) escape(i int) (n int, escaped bool, err error) {
	in := r.in
	if i+1 >= len(in) {
		return 0, false, invalidJSON(synUnterminatedStr)
	}
	var cp rune
	switch in[i+1] {
	case '"':
		cp = '"'
	case '\\':
		cp = '\\'
	case '/':
		cp = '/'
	case 'b':
		cp = '\b'
	case 'f':
		cp = '\f'
	case 'n':
		cp = '\n'
	case 'r':
		cp = '\r'
	case 't':
		cp = '\t'
	case 'u':
		hi, ok := hex4(in, i+2)
		if !ok {
			return 0, false, invalidJSON(synUnicodeEscape)
		}
		n = 6
		cp = hi
		switch {
		case hi >= 0xD800 && hi < 0xDC00:
			if i+12 > len(in) || in[i+6] != '\\' || in[i+7] != 'u' {
				return 0, false, invalidJSON(synLoneSurrogate)
			}
			lo, ok := hex4(in, i+8)
			if !ok || lo < 0xDC00 || lo >= 0xE000 {
				return 0, false, invalidJSON(synLoneSurrogate)
			}
			cp = 0x10000 + (hi-0xD800)<<10 + (lo - 0xDC00)
			n = 12
		case hi >= 0xDC00 && hi < 0xE000:
			return 0, false, invalidJSON(synLoneSurrogate)
		}
	default:
		return 0, false, invalidJSON(synEscape)
	}
	if n == 0 {
		n = 2
	}
	var esc bool
	r.out, esc = appendCanonicalRune(r.out, cp)
	return n, esc, nil
}

func hex4(in []byte, i int) (rune, bool) {
	if i+4 > len(in) {
		return 0, false
	}
	var v rune
	for _, c := range in[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

const hexDigits = "0123456789abcdef"

// appendCanonicalRune writes one character as RFC 8785 (ECMAScript
// JSON.stringify) does: the two mandatory escapes, the short forms for
// control characters that have one, \u00xx (lowercase) for the rest of
// U+0000..U+001F, and every other character as raw UTF-8.
func appendCanonicalRune(out []byte, cp rune) ([]byte, bool) {
	switch cp {
	case '"':
		return append(out, '\\', '"'), true
	case '\\':
		return append(out, '\\', '\\'), true
	case '\b':
		return append(out, '\\', 'b'), true
	case '\f':
		return append(out, '\\', 'f'), true
	case '\n':
		return append(out, '\\', 'n'), true
	case '\r':
		return append(out, '\\', 'r'), true
	case '\t':
		return append(out, '\\', 't'), true
	}
	if cp < 0x20 {
		return append(out, '\\', 'u', '0', '0', hexDigits[cp>>4], hexDigits[cp&0xF]), true
	}
	return utf8.AppendRune(out, cp), false
}

// appendCanonicalString writes s (valid UTF-8) as a canonical JSON string.
func appendCanonicalString(out []byte, s string) []byte {
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[start:i]...)
		out, _ = appendCanonicalRune(out, rune(c))
		start = i + 1
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}

// unescapeCanonical appends the decoded content of a canonical string body
// (without quotes). Only the escapes appendCanonicalRune writes can occur.
func unescapeCanonical(dst, s []byte) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			dst = append(dst, c)
			continue
		}
		i++
		switch s[i] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			if v, ok := hex4(s, i+1); ok {
				dst = append(dst, byte(v))
				i += 4
			}
		default:
			dst = append(dst, s[i])
		}
	}
	return dst
}

// number reads a number, enforcing the JSON grammar (no leading zeros, no
// '+', digits on both sides of '.'), and writes its ECMAScript form. intLexeme
// reports a lexeme without fraction or exponent, which is what "exact
// integer" means for the contract's integer members.
func (r *reader) number() (intLexeme bool, f float64, err error) {
	in := r.in
	start := r.pos
	i, ndigits, intLexeme, ok := scanNumber(in, start)
	if !ok {
		return false, 0, invalidJSON(synNumber)
	}
	r.pos = i
	lex := in[start:i]
	// Integers of at most 15 digits are exact doubles whose ECMAScript form
	// is the lexeme itself (the grammar already excludes leading zeros);
	// only -0 changes.
	if intLexeme && ndigits <= 15 {
		if len(lex) == 2 && lex[0] == '-' && lex[1] == '0' {
			r.out = append(r.out, '0')
		} else {
			r.out = append(r.out, lex...)
		}
		return true, 0, nil
	}
	f, perr := strconv.ParseFloat(string(lex), 64)
	if perr != nil {
		// The grammar was checked above, so the only failure left is a
		// magnitude beyond the largest finite double.
		return false, 0, invalidJSON(synNumberRange)
	}
	r.out = appendES6(r.out, f)
	return intLexeme, f, nil
}

// scanNumber checks the JSON number grammar at in[start:] and returns the end
// of the lexeme and the number of integer-part digits.
func scanNumber(in []byte, start int) (end, ndigits int, intLexeme, ok bool) {
	i := start
	if in[i] == '-' {
		i++
	}
	digits := i
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && in[i] >= '1' && in[i] <= '9':
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
	default:
		return 0, 0, false, false
	}
	intLexeme = true
	ndigits = i - digits
	if i < len(in) && in[i] == '.' {
		intLexeme = false
		i++
		d := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		if i == d {
			return 0, 0, false, false
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		intLexeme = false
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		d := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		if i == d {
			return 0, 0, false, false
		}
	}
	return i, ndigits, intLexeme, true
}
