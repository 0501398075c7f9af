package store

import (
	"encoding/hex"
	"regexp"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// Outcomes and reasons are short lowercase codes; anything else is a caller bug.
var codeRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// correlationRE bounds correlation ids to printable, log-safe text.
var correlationRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{0,128}$`)

const maxSequence = envelope.MaxSequence

// validIdentity applies the contract's identity rule (§1) to tenant,
// project, producer, account, device and key ids. The store re-checks it so
// a caller bug cannot write an identity the HTTP layer would have refused.
func validIdentity(ids ...string) bool {
	for _, id := range ids {
		if !envelope.ValidIdentity(id) {
			return false
		}
	}
	return true
}

// decodeEventIdentity accepts the lowercase hex form of contract §1.
func decodeEventIdentity(s string) ([]byte, bool) {
	if len(s) != 64 {
		return nil, false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return nil, false
		}
	}
	b, err := hex.DecodeString(s)
	return b, err == nil
}

// ValidCode reports whether code has the form of an outcome, reason or error
// code (a-z 0-9 _, starting with a letter, at most 64 bytes), so a filter
// can be refused before it is sent.
func ValidCode(code string) bool { return codeRE.MatchString(code) }
