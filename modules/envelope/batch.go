package envelope

// MaxBatch is the largest number of items in one batch request (envelopes,
// or outbox messages).
const MaxBatch = 100

// SplitBatch reads a batch body {"envelopes":[...]} and returns each item's
// own bytes, in order, for the caller to Parse one by one.
//
// The byte limit (default MaxBytes) applies to the whole body and is
// reported as body_too_large. The wrapper is judged strictly: it must be
// well-formed JSON, an object whose only member is "envelopes", an array of
// 1..MaxBatch items; anything else is a whole-request invalid_envelope.
// Items are only checked for JSON grammar, which is what finding their
// boundaries needs: depth and item limits, duplicate names, UTF-8, numbers
// and the envelope rules apply to each item on its own when it is parsed, so
// one bad item (say, a number or a too-deep object) gets its own
// invalid_envelope and does not sink its neighbours.
func SplitBatch(data []byte) ([][]byte, error) { return splitWrapped(data, "envelopes") }

// SplitOutboxBatch reads a POST /v1/outbox/batch body {"messages":[...]}
// (contract §8.5) exactly as SplitBatch reads an envelope batch: the same
// byte limit, the same strict wrapper of 1..MaxBatch items, and items checked
// only for JSON grammar. Any wrapper error is the caller's whole-request
// refusal (the outbox route answers it invalid_request).
func SplitOutboxBatch(data []byte) ([][]byte, error) { return splitWrapped(data, "messages") }

func splitWrapped(data []byte, member string) ([][]byte, error) {
	lim := DefaultLimits()
	if len(data) > lim.MaxBytes {
		return nil, &Error{Reason: ReasonBodyTooLarge, Detail: BodyTooLargeDetail(lim.MaxBytes)}
	}
	s := scanner{in: data}
	s.ws()
	if !s.eat('{') {
		return nil, invalid(prefixBatch + string(synBatchNotObject))
	}
	var items [][]byte
	seen := false
	s.ws()
	if s.eat('}') {
		return nil, invalid(wrapperDetail(member, wrapMissing))
	}
	for {
		s.ws()
		if s.pos >= len(s.in) || s.in[s.pos] != '"' {
			return nil, s.fail(synMemberName)
		}
		// Decode the name with the strict reader so "envelop\u0065s" is
		// recognised and a broken name is refused.
		kr := getReader(s.in, lim, false)
		kr.pos, kr.out = s.pos, make([]byte, 0, 16)
		_, err := kr.str()
		var name string
		if err == nil {
			name = string(unescapeCanonical(nil, kr.out[1:len(kr.out)-1]))
			s.pos = kr.pos
		}
		putReader(kr)
		if err != nil {
			return nil, err
		}
		if name != member {
			return nil, invalid(prefixBatch + string(synBatchUnknown))
		}
		if seen {
			return nil, invalid(wrapperDetail(member, wrapDuplicate))
		}
		seen = true
		s.ws()
		if !s.eat(':') {
			return nil, s.fail(synColon)
		}
		s.ws()
		if !s.eat('[') {
			return nil, invalid(wrapperDetail(member, wrapNotArray))
		}
		s.ws()
		if !s.eat(']') {
			for {
				s.ws()
				start := s.pos
				if err := s.skipValue(); err != nil {
					return nil, err
				}
				if len(items) == MaxBatch {
					return nil, invalid(wrapperDetail(member, wrapCount))
				}
				items = append(items, data[start:s.pos:s.pos])
				s.ws()
				if s.eat(',') {
					continue
				}
				if s.eat(']') {
					break
				}
				return nil, s.fail(synArraySep)
			}
		}
		s.ws()
		if s.eat(',') {
			continue
		}
		if s.eat('}') {
			break
		}
		return nil, s.fail(synObjectSep)
	}
	s.ws()
	if s.pos != len(s.in) {
		return nil, s.fail(synTrailing)
	}
	if len(items) == 0 {
		return nil, invalid(wrapperDetail(member, wrapCount))
	}
	return items, nil
}

// scanner checks JSON grammar without recursion, so an item nested far
// beyond the depth limit is still delimited (and then refused on its own)
// instead of exhausting the stack.
type scanner struct {
	in  []byte
	pos int
}

func (s *scanner) ws() {
	for s.pos < len(s.in) {
		switch s.in[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) eat(c byte) bool {
	if s.pos < len(s.in) && s.in[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

func (s *scanner) fail(what syntax) error {
	return invalid(prefixBatch + string(what))
}

// skipValue moves past one JSON value, checking structure (brackets,
// separators, string termination, token spelling) but not content.
func (s *scanner) skipValue() error {
	var stack []byte // open containers, '{' or '['
	for {
		// A value is expected here.
		s.ws()
		if s.pos >= len(s.in) {
			return s.fail(synEnd)
		}
		switch c := s.in[s.pos]; {
		case c == '{':
			s.pos++
			s.ws()
			if s.eat('}') {
				break
			}
			stack = append(stack, '{')
			if err := s.memberName(); err != nil {
				return err
			}
			continue
		case c == '[':
			s.pos++
			s.ws()
			if s.eat(']') {
				break
			}
			stack = append(stack, '[')
			continue
		case c == '"':
			if err := s.skipString(); err != nil {
				return err
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if err := s.skipNumber(); err != nil {
				return err
			}
		case c == 't', c == 'f', c == 'n':
			lit := "null"
			if c == 't' {
				lit = "true"
			} else if c == 'f' {
				lit = "false"
			}
			if len(s.in)-s.pos < len(lit) || string(s.in[s.pos:s.pos+len(lit)]) != lit {
				return s.fail(synLiteral)
			}
			s.pos += len(lit)
		default:
			return s.fail(synChar)
		}
		// A value just ended: close containers until one continues.
		for {
			if len(stack) == 0 {
				return nil
			}
			s.ws()
			top := stack[len(stack)-1]
			if s.eat(',') {
				if top == '{' {
					if err := s.memberName(); err != nil {
						return err
					}
				}
				break
			}
			if (top == '{' && s.eat('}')) || (top == '[' && s.eat(']')) {
				stack = stack[:len(stack)-1]
				continue
			}
			return s.fail(synSeparator)
		}
	}
}

func (s *scanner) memberName() error {
	s.ws()
	if s.pos >= len(s.in) || s.in[s.pos] != '"' {
		return s.fail(synMemberName)
	}
	if err := s.skipString(); err != nil {
		return err
	}
	s.ws()
	if !s.eat(':') {
		return s.fail(synColon)
	}
	return nil
}

func (s *scanner) skipString() error {
	for i := s.pos + 1; i < len(s.in); i++ {
		switch s.in[i] {
		case '\\':
			i++
		case '"':
			s.pos = i + 1
			return nil
		}
	}
	return s.fail(synUnterminatedStr)
}

func (s *scanner) skipNumber() error {
	// Only the grammar: range is the item's own business.
	end, _, _, ok := scanNumber(s.in, s.pos)
	if !ok {
		return s.fail(synNumber)
	}
	s.pos = end
	return nil
}
