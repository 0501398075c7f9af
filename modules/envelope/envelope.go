package envelope

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"time"
)

// SigningPrefix is the domain-separation prefix of every signing input.
const SigningPrefix = "controlplane/v1\n"

// SchemaVersion is the only schema version this package accepts at step 4.
const SchemaVersion = 1

// MaxSequence is the largest sequence number (2^53-1, the largest integer a
// double holds exactly, so every JSON implementation agrees on it).
const MaxSequence = 1<<53 - 1

// MaxFutureSkew is how far issued_at may lie ahead of the receiver's clock.
const MaxFutureSkew = 5 * time.Minute

// DefaultReplayWindow is the contract's default replay window (90 days),
// used by Validate when it is given a window <= 0.
const DefaultReplayWindow = 90 * 24 * time.Hour

// Metadata is the closed metadata object. Optional members that are absent
// are empty strings.
type Metadata struct {
	Kind, CorrelationID, Traceparent string
}

// Envelope is a parsed controlplane/v1 envelope. Every exported field is
// decoded from the canonical form; Payload aliases the canonical bytes and
// must not be modified.
//
// An Envelope returned by Parse has passed step 2 only. Metadata is filled
// at parse time when the metadata object is valid and left zero otherwise;
// either way it must not be relied on before Validate (step 4) returned nil.
type Envelope struct {
	// SchemaVersion is the exact integer that was sent. Step 2 only checks
	// that it is an integer; Validate refuses anything but 1. Integers beyond
	// the int64 range are clamped, which keeps them != 1.
	SchemaVersion                                                   int64
	TenantID, ProjectID, ProducerID, EventID, IdempotencyKey, KeyID string
	Sequence                                                        int64
	IssuedAt                                                        time.Time
	Metadata                                                        Metadata
	// Payload is the canonical JSON of the payload value.
	Payload []byte
	// Signature is the decoded 64-byte Ed25519 signature.
	Signature []byte

	signingInput []byte
	canonical    []byte
	sigValue     int    // offset of the signature string's first character in canonical
	metaProblem  string // why metadata fails step 4; empty when it passes
}

// Members of the envelope in RFC 8785 order, which is the order the reader
// leaves them in.
var envelopeMembers = [...]string{
	"event_id", "idempotency_key", "issued_at", "key_id", "metadata", "payload",
	"producer_id", "project_id", "schema_version", "sequence", "signature", "tenant_id",
}

const (
	mEventID = iota
	mIdempotencyKey
	mIssuedAt
	mKeyID
	mMetadata
	mPayload
	mProducerID
	mProjectID
	mSchemaVersion
	mSequence
	mSignature
	mTenantID
	numMembers
)

// Parse reads data as a controlplane/v1 envelope under the default limits and
// performs step 2 of the contract: well-formed strict JSON within the limits,
// exactly the envelope members, and every member of the right type and
// shape. Errors are *Error with ReasonInvalidEnvelope, or ReasonBodyTooLarge
// for more than MaxBytes. The signature is not verified (see Verify) and the
// schema version, metadata and time window are not judged (see Validate).
func Parse(data []byte) (*Envelope, error) {
	return ParseWithLimits(data, Limits{})
}

// ParseWithLimits is Parse with limits tightened by l.
func ParseWithLimits(data []byte, l Limits) (*Envelope, error) {
	r := getReader(data, effective(l), true)
	defer putReader(r)
	if err := r.run(); err != nil {
		return nil, err
	}
	if r.out[0] != '{' {
		return nil, invalid(detailNotObject)
	}
	return build(r.out, r)
}

func build(canonical []byte, r *reader) (*Envelope, error) {
	ms := r.members
	if len(ms) != numMembers || !hasEnvelopeMembers(r, ms) {
		return nil, memberSetError(r, ms)
	}
	e := &Envelope{canonical: canonical[:len(canonical):len(canonical)]}
	str := func(i int) []byte {
		m := &ms[i]
		if m.kind != kindString {
			return nil
		}
		body := canonical[m.val+1 : m.end-1]
		for _, c := range body {
			if c == '\\' {
				return unescapeCanonical(nil, body)
			}
		}
		return body
	}

	// Checks run in the contract table's order so the first reported
	// problem is predictable.
	sv := &ms[mSchemaVersion]
	if sv.kind != kindNumber || !sv.intLexeme {
		return nil, invalid(detailSchemaType)
	}
	// ParseInt clamps out-of-range values, which keeps them != 1 for step 4.
	e.SchemaVersion, _ = strconv.ParseInt(string(r.in[sv.rawStart:sv.rawEnd]), 10, 64)

	ids := [...]struct {
		idx   int
		name  string
		check func([]byte) bool
		dst   *string
	}{
		{mTenantID, "tenant_id", validIdentity, &e.TenantID},
		{mProjectID, "project_id", validIdentity, &e.ProjectID},
		{mProducerID, "producer_id", validIdentity, &e.ProducerID},
		{mEventID, "event_id", validEventID, &e.EventID},
		{mIdempotencyKey, "idempotency_key", validIdempotencyKey, &e.IdempotencyKey},
		{mKeyID, "key_id", validIdentity, &e.KeyID},
	}
	for _, f := range ids {
		if ms[f.idx].kind != kindString {
			return nil, invalid(memberTypeDetail(f.name))
		}
		v := str(f.idx)
		if !f.check(v) {
			return nil, invalid(memberRuleDetail(f.name))
		}
		*f.dst = string(v)
	}

	sq := &ms[mSequence]
	if sq.kind != kindNumber || !sq.intLexeme {
		return nil, invalid(detailSequenceType)
	}
	seq, err := strconv.ParseInt(string(r.in[sq.rawStart:sq.rawEnd]), 10, 64)
	if err != nil || seq < 1 || seq > MaxSequence {
		return nil, invalid(detailSequenceRange)
	}
	e.Sequence = seq

	if ms[mIssuedAt].kind != kindString {
		return nil, invalid(detailIssuedAtType)
	}
	t, ok := parseTimestamp(str(mIssuedAt))
	if !ok {
		return nil, invalid(detailIssuedAtFormat)
	}
	e.IssuedAt = t

	mm := &ms[mMetadata]
	if mm.kind != kindObject {
		return nil, invalid(detailMetadataType)
	}

	pm := &ms[mPayload]
	e.Payload = canonical[pm.val:pm.end:pm.end]

	sm := &ms[mSignature]
	if sm.kind != kindString {
		return nil, invalid(detailSignatureType)
	}
	sig, ok := decodeSignature(canonical[sm.val+1 : sm.end-1])
	if !ok {
		return nil, invalid(detailSignatureFormat)
	}
	e.Signature = sig
	e.sigValue = sm.val + 1

	// The signing input is the canonical envelope minus the signature member
	// and its separating comma. Members are contiguous and comma-separated,
	// and signature is never first, so the comma before it goes.
	si := make([]byte, 0, len(SigningPrefix)+len(canonical))
	si = append(si, SigningPrefix...)
	si = append(si, canonical[:sm.start-1]...)
	si = append(si, canonical[sm.end:]...)
	e.signingInput = si

	e.Metadata, e.metaProblem = parseMetadata(canonical[mm.val:mm.end])
	return e, nil
}

func hasEnvelopeMembers(r *reader, ms []member) bool {
	for i := range ms {
		if string(r.key(&ms[i])) != envelopeMembers[i] {
			return false
		}
	}
	return true
}

// memberSetError names a missing member (one of ours) but never echoes an
// unknown one: its name is request content.
func memberSetError(r *reader, ms []member) *Error {
	present := make(map[string]bool, len(ms))
	for i := range ms {
		present[string(r.key(&ms[i]))] = true
	}
	for k := range present {
		if !isEnvelopeMember(k) {
			return invalid(detailUnknownMember)
		}
	}
	for _, name := range envelopeMembers {
		if !present[name] {
			return invalid(missingMemberDetail(name))
		}
	}
	return invalid(detailMemberSet)
}

func isEnvelopeMember(k string) bool {
	for _, n := range envelopeMembers {
		if n == k {
			return true
		}
	}
	return false
}

func isAlnum(c byte) bool {
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
}

// validIdentity applies IdentityPattern.
func validIdentity(s []byte) bool {
	if len(s) == 0 || len(s) > 64 || !isAlnum(s[0]) {
		return false
	}
	for _, c := range s[1:] {
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// validEventID applies EventIDPattern.
func validEventID(s []byte) bool {
	if len(s) == 0 || len(s) > 128 || !isAlnum(s[0]) {
		return false
	}
	for _, c := range s[1:] {
		if !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

func validIdempotencyKey(s []byte) bool {
	if len(s) == 0 || len(s) > 255 {
		return false
	}
	for _, c := range s {
		if c < 0x21 || c > 0x7E {
			return false
		}
	}
	return true
}

// decodeSignature accepts exactly 86 characters of the base64url alphabet
// with zero trailing bits. The explicit alphabet check matters: Go's decoder
// silently skips CR and LF, which would make many strings one signature.
func decodeSignature(s []byte) ([]byte, bool) {
	if len(s) != 86 {
		return nil, false
	}
	for _, c := range s {
		if !isAlnum(c) && c != '-' && c != '_' {
			return nil, false
		}
	}
	sig := make([]byte, 64)
	n, err := base64.RawURLEncoding.Strict().Decode(sig, s)
	if err != nil || n != 64 {
		return nil, false
	}
	return sig, true
}

// parseTimestamp accepts YYYY-MM-DDTHH:MM:SS[.fraction]Z with an upper-case
// T and Z, 1-9 fraction digits and calendar-valid fields. Leap seconds (:60)
// and numeric offsets are refused: the contract wants UTC with Z, and one
// instant should have as few spellings as possible.
func parseTimestamp(s []byte) (time.Time, bool) {
	if len(s) < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' {
		return time.Time{}, false
	}
	num := func(i, n int) (int, bool) {
		v := 0
		for _, c := range s[i : i+n] {
			if c < '0' || c > '9' {
				return 0, false
			}
			v = v*10 + int(c-'0')
		}
		return v, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 2)
	day, ok3 := num(8, 2)
	hour, ok4 := num(11, 2)
	minute, ok5 := num(14, 2)
	sec, ok6 := num(17, 2)
	if !(ok1 && ok2 && ok3 && ok4 && ok5 && ok6) {
		return time.Time{}, false
	}
	if month < 1 || month > 12 || day < 1 || day > daysIn(month, year) || hour > 23 || minute > 59 || sec > 59 {
		return time.Time{}, false
	}
	nsec := 0
	rest := s[19:]
	if rest[0] == '.' {
		digits := 0
		rest = rest[1:]
		for len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9' {
			// RFC 3339 puts no bound on fraction digits; time keeps nanoseconds, so
			// digits past the ninth are read (they must still be digits) and dropped.
			if digits < 9 {
				nsec = nsec*10 + int(rest[0]-'0')
			}
			digits++
			rest = rest[1:]
		}
		if digits == 0 {
			return time.Time{}, false
		}
		for ; digits < 9; digits++ {
			nsec *= 10
		}
	}
	if len(rest) != 1 || rest[0] != 'Z' {
		return time.Time{}, false
	}
	return time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC), true
}

func daysIn(month, year int) int {
	switch month {
	case 2:
		if year%4 == 0 && (year%100 != 0 || year%400 == 0) {
			return 29
		}
		return 28
	case 4, 6, 9, 11:
		return 30
	}
	return 31
}

// SigningInput returns "controlplane/v1\n" || JCS(envelope without signature).
// The slice is shared; do not modify it.
func (e *Envelope) SigningInput() []byte { return e.signingInput }

// Canonical returns JCS of the whole envelope, signature included: the form
// that is stored, served and delivered. The slice is shared; do not modify it.
func (e *Envelope) Canonical() []byte { return e.canonical }

// EventIdentity returns the envelope's event_identity (lowercase hex).
func (e *Envelope) EventIdentity() string {
	return EventIdentity(e.TenantID, e.ProjectID, e.EventID)
}

// ContentDigest returns SHA-256 of the signing input; equal digests tell a
// duplicate from a conflict.
func (e *Envelope) ContentDigest() [32]byte { return sha256.Sum256(e.signingInput) }

// IdempotencyDigest returns the digest that is stored instead of the raw
// idempotency key.
func (e *Envelope) IdempotencyDigest() [32]byte {
	return IdempotencyDigest(e.TenantID, e.ProjectID, e.IdempotencyKey)
}

// EventIdentity returns lowercase hex SHA-256 of tenant "\n" project "\n" eventID.
func EventIdentity(tenant, project, eventID string) string {
	d := scopedDigest(tenant, project, eventID)
	return hex.EncodeToString(d[:])
}

// IdempotencyDigest returns SHA-256 of tenant "\n" project "\n" key.
func IdempotencyDigest(tenant, project, key string) [32]byte {
	return scopedDigest(tenant, project, key)
}

func scopedDigest(tenant, project, v string) [32]byte {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{'\n'})
	h.Write([]byte(project))
	h.Write([]byte{'\n'})
	h.Write([]byte(v))
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// Validate performs step 4 against the receiver's clock: schema_version must
// be 1 (unsupported_schema), metadata must be the closed object
// (invalid_metadata), issued_at may be at most MaxFutureSkew ahead of now
// (issued_in_future) and at most replayWindow behind it (expired). Both
// bounds are inclusive. A replayWindow <= 0 means DefaultReplayWindow.
func (e *Envelope) Validate(now time.Time, replayWindow time.Duration) error {
	if e.SchemaVersion != SchemaVersion {
		return &Error{Reason: ReasonUnsupportedSchema, Detail: detailSchemaVersion}
	}
	if e.metaProblem != "" {
		return &Error{Reason: ReasonInvalidMetadata, Detail: e.metaProblem}
	}
	if replayWindow <= 0 {
		replayWindow = DefaultReplayWindow
	}
	if e.IssuedAt.Sub(now) > MaxFutureSkew {
		return &Error{Reason: ReasonIssuedInFuture, Detail: detailIssuedInFuture}
	}
	if now.Sub(e.IssuedAt) > replayWindow {
		return &Error{Reason: ReasonExpired, Detail: detailExpired}
	}
	return nil
}
