package envelope

import "strconv"

// The sentences an Error's Detail can hold (contract §8.11), all here so
// that none can quietly start quoting the request: a Detail names the rule
// that failed and the contract member it concerns, and nothing else. Only
// the limits in force (configuration, never request content) and member
// names of the contract are ever put into one. KnownDetails lists them all,
// which is what the tests hold every refusal to.

// syntax is one JSON grammar problem, reported with the prefix of the
// reader that found it: "json: " (the strict reader) or "batch: " (the
// wrapper scanner of SplitBatch and SplitOutboxBatch). Never a byte offset:
// where a body broke says something about its content.
type syntax string

const (
	synEmpty                 syntax = "empty document"
	synTrailing              syntax = "data after the top-level value"
	synEnd                   syntax = "unexpected end of input"
	synChar                  syntax = "unexpected character"
	synLiteral               syntax = "invalid literal"
	synUnterminatedArr       syntax = "unterminated array"
	synUnterminatedObj       syntax = "unterminated object"
	synArraySep              syntax = "expected ',' or ']'"
	synObjectSep             syntax = "expected ',' or '}'"
	synSeparator             syntax = "expected a separator or a closing bracket"
	synMemberName            syntax = "expected a member name"
	synColon                 syntax = "expected ':'"
	synDuplicateMember       syntax = "duplicate member name in object"
	synUnterminatedStr       syntax = "unterminated string"
	synControl               syntax = "control character in string"
	synUTF8                  syntax = "invalid UTF-8"
	synUnicodeEscape         syntax = "invalid \\u escape"
	synLoneSurrogate         syntax = "lone surrogate"
	synEscape                syntax = "invalid escape"
	synNumber                syntax = "invalid number"
	synNumberRange           syntax = "number outside the IEEE-754 double range"
	synBatchNotObject        syntax = "must be an object"
	synBatchUnknown          syntax = "unknown member"
	prefixJSON                      = "json: "
	prefixBatch                     = "batch: "
	detailNotObject                 = "envelope must be a JSON object"
	detailUnknownMember             = "unknown member"
	detailMemberSet                 = "unexpected member set"
	detailSchemaType                = "schema_version: must be an integer"
	detailSchemaVersion             = "schema_version: only 1 is supported"
	detailSequenceType              = "sequence: must be an integer"
	detailSequenceRange             = "sequence: must be in 1..9007199254740991"
	detailIssuedAtType              = "issued_at: must be a string"
	detailIssuedAtFormat            = "issued_at: must be RFC 3339 UTC with Z, e.g. 2026-11-29T20:00:00Z"
	detailIssuedAtMissing           = "issued_at: missing"
	detailIssuedInFuture            = "issued_at: more than 5m ahead of the receiver's clock"
	detailExpired                   = "issued_at: older than the replay window"
	detailMetadataType              = "metadata: must be an object"
	detailMetadataUnreadable        = "metadata: unreadable"
	detailMetadataUnknown           = "metadata: unknown member"
	detailMetadataNoKind            = "metadata: missing member kind"
	detailPayloadMissing            = "payload: missing"
	detailSignatureType             = "signature: must be a string"
	detailSignatureFormat           = "signature: must be unpadded base64url of 64 bytes"
	detailBadSignature              = "signature does not verify"
)

var syntaxProblems = [...]syntax{
	synEmpty, synTrailing, synEnd, synChar, synLiteral, synUnterminatedArr, synUnterminatedObj, synArraySep,
	synObjectSep, synSeparator, synMemberName, synColon, synDuplicateMember, synUnterminatedStr, synControl,
	synUTF8, synUnicodeEscape, synLoneSurrogate, synEscape, synNumber, synNumberRange, synBatchNotObject,
	synBatchUnknown,
}

// wrapperRule is what a batch wrapper's one member ("envelopes" or
// "messages", named by the caller, never by the request) failed.
type wrapperRule string

const (
	wrapMissing   wrapperRule = "missing"
	wrapDuplicate wrapperRule = "duplicate member"
	wrapNotArray  wrapperRule = "must be an array"
	wrapCount     wrapperRule = "must hold 1..100 items" // MaxBatch
)

var wrapperRules = [...]wrapperRule{wrapMissing, wrapDuplicate, wrapNotArray, wrapCount}

// wrapperMembers are the members SplitBatch and SplitOutboxBatch unwrap.
var wrapperMembers = [...]string{"envelopes", "messages"}

func wrapperDetail(member string, r wrapperRule) string {
	return prefixBatch + member + ": " + string(r)
}

// ruleText is the rule of each string member of the envelope that has one.
var ruleText = map[string]string{
	"tenant_id":       "must match " + IdentityPattern,
	"project_id":      "must match " + IdentityPattern,
	"producer_id":     "must match " + IdentityPattern,
	"key_id":          "must match " + IdentityPattern,
	"event_id":        "must match " + EventIDPattern,
	"idempotency_key": "must be 1-255 bytes, each 0x21-0x7E",
}

// metadataRule is the rule of each metadata member.
var metadataRule = map[string]string{
	"kind":           "must match ^[a-z][a-z0-9_.-]{0,63}$",
	"correlation_id": "must match ^[A-Za-z0-9._:-]{1,128}$",
	"traceparent":    "must be a W3C traceparent, version 00, lowercase hex, non-zero ids",
}

// memberRuleDetail is the detail of a string member of the envelope (name
// is one of ruleText's keys) that breaks its rule.
func memberRuleDetail(name string) string { return name + ": " + ruleText[name] }

// memberTypeDetail is the detail of a string member of the envelope that
// is not a string.
func memberTypeDetail(name string) string { return name + ": must be a string" }

// missingMemberDetail names a missing member of the envelope (one of
// envelopeMembers, never a name from the request).
func missingMemberDetail(name string) string { return "missing member " + name }

func metadataRuleDetail(name string) string { return "metadata." + name + ": " + metadataRule[name] }
func metadataTypeDetail(name string) string { return "metadata." + name + ": must be a string" }

// BodyTooLargeDetail is the detail of a body over max bytes (413).
func BodyTooLargeDetail(max int) string { return "body larger than " + strconv.Itoa(max) + " bytes" }

func depthDetail(max int) string { return prefixJSON + "nesting deeper than " + strconv.Itoa(max) }
func itemsDetail(max int) string { return prefixJSON + "more than " + strconv.Itoa(max) + " items" }

// KnownDetails lists every Detail an Error of this package can carry when
// documents are read with limits l (zero fields: the contract's), so that
// tests can hold every refusal to this list and a caller can tell a
// sentence of this package from anything else.
func KnownDetails(l Limits) []string {
	l = effective(l)
	out := []string{
		detailNotObject, detailUnknownMember, detailMemberSet, detailSchemaType, detailSchemaVersion,
		detailSequenceType, detailSequenceRange, detailIssuedAtType, detailIssuedAtFormat, detailIssuedAtMissing,
		detailIssuedInFuture, detailExpired, detailMetadataType, detailMetadataUnreadable, detailMetadataUnknown,
		detailMetadataNoKind, detailPayloadMissing, detailSignatureType, detailSignatureFormat, detailBadSignature,
		BodyTooLargeDetail(l.MaxBytes), BodyTooLargeDetail(MaxDocumentBytes), depthDetail(l.MaxDepth), itemsDetail(l.MaxItems),
	}
	if l.MaxDepth != defaultMaxDepth || l.MaxItems != defaultMaxItems {
		// Metadata is read again with the contract's limits.
		out = append(out, depthDetail(defaultMaxDepth), itemsDetail(defaultMaxItems))
	}
	for _, p := range syntaxProblems {
		out = append(out, prefixJSON+string(p), prefixBatch+string(p))
	}
	for _, m := range wrapperMembers {
		for _, r := range wrapperRules {
			out = append(out, wrapperDetail(m, r))
		}
	}
	for name := range ruleText {
		out = append(out, memberRuleDetail(name))
	}
	for _, name := range envelopeMembers {
		out = append(out, memberTypeDetail(name), missingMemberDetail(name))
	}
	for name := range metadataRule {
		out = append(out, metadataRuleDetail(name), metadataTypeDetail(name))
	}
	return out
}
