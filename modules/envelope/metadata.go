package envelope

// parseMetadata judges the canonical metadata object for step 4. It runs at
// parse time (the object is small and already canonical, so this is a cheap
// second read) and remembers the verdict, so Validate stays allocation-free
// and the order of steps stays the contract's: the verdict is only reported
// after the signature has been verified.
func parseMetadata(raw []byte) (Metadata, string) {
	r := getReader(raw, DefaultLimits(), true)
	defer putReader(r)
	if err := r.run(); err != nil {
		// raw is a canonical sub-document of a document that was just
		// accepted, so this cannot happen; refuse rather than trust it.
		return Metadata{}, detailMetadataUnreadable
	}
	var md Metadata
	for i := range r.members {
		m := &r.members[i]
		name := string(r.key(m))
		var check func([]byte) bool
		var dst *string
		switch name {
		case "kind":
			check, dst = validKind, &md.Kind
		case "correlation_id":
			check, dst = validCorrelationID, &md.CorrelationID
		case "traceparent":
			check, dst = validTraceparent, &md.Traceparent
		default:
			return Metadata{}, detailMetadataUnknown
		}
		if m.kind != kindString {
			return Metadata{}, metadataTypeDetail(name)
		}
		// None of the three rules admits '"', '\' or control characters,
		// so an escaped canonical string is refused as it stands.
		v := raw[m.val+1 : m.end-1]
		if !check(v) {
			return Metadata{}, metadataRuleDetail(name)
		}
		*dst = string(v)
	}
	if md.Kind == "" {
		return Metadata{}, detailMetadataNoKind
	}
	return md, ""
}

// validKind: ^[a-z][a-z0-9_.-]{0,63}$
func validKind(s []byte) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, c := range s[1:] {
		if !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// validCorrelationID: ^[A-Za-z0-9._:-]{1,128}$
func validCorrelationID(s []byte) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !isAlnum(c) && c != '.' && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

// validTraceparent accepts exactly version 00 of W3C Trace Context:
// "00-" 32 hex "-" 16 hex "-" 2 hex, lowercase, trace-id and parent-id not
// all zero. Later versions may append fields; the contract pins version 00,
// so its exact length is required.
func validTraceparent(s []byte) bool {
	if len(s) != 55 || s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	lowerHex := func(b []byte) (ok, nonZero bool) {
		for _, c := range b {
			if !(c >= '0' && c <= '9') && !(c >= 'a' && c <= 'f') {
				return false, false
			}
			if c != '0' {
				nonZero = true
			}
		}
		return true, nonZero
	}
	okT, nzT := lowerHex(s[3:35])
	okP, nzP := lowerHex(s[36:52])
	okF, _ := lowerHex(s[53:55])
	return okT && nzT && okP && nzP && okF
}
