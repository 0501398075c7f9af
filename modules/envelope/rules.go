package envelope

// The contract's member rules, exported so other layers (path parameters,
// envctl flags, the outbox request) apply exactly the rules receivers apply.

// IdentityPattern is the contract's identity rule (§1) of tenant_id,
// project_id, producer_id and key_id, as messages and docs quote it;
// ValidIdentity applies it without a regexp.
const IdentityPattern = `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`

// EventIDPattern is the contract's event_id rule (§1); ValidEventID applies it.
const EventIDPattern = `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`

// ValidIdentity reports whether s satisfies IdentityPattern.
func ValidIdentity(s string) bool { return validIdentity([]byte(s)) }

// ValidEventID reports whether s satisfies EventIDPattern.
func ValidEventID(s string) bool { return validEventID([]byte(s)) }

// ValidIdempotencyKey reports whether s is 1-255 bytes, each 0x21-0x7E.
func ValidIdempotencyKey(s string) bool { return validIdempotencyKey([]byte(s)) }

// Validate applies the step-4 metadata rules to m (Kind required; optional
// members are absent when empty) and returns an *Error with
// ReasonInvalidMetadata. Sign does not call it; the outbox should, before
// it signs what a receiver would refuse.
func (m Metadata) Validate() error {
	fail := func(name string) error {
		return &Error{Reason: ReasonInvalidMetadata, Detail: metadataRuleDetail(name)}
	}
	if !validKind([]byte(m.Kind)) {
		return fail("kind")
	}
	if m.CorrelationID != "" && !validCorrelationID([]byte(m.CorrelationID)) {
		return fail("correlation_id")
	}
	if m.Traceparent != "" && !validTraceparent([]byte(m.Traceparent)) {
		return fail("traceparent")
	}
	return nil
}
