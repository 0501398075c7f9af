package envelope

import "bytes"

var (
	metadataOpen      = []byte(`"metadata":{`)
	traceparentMember = []byte(`"traceparent":"`)
)

// TraceparentOf is metadata.traceparent of a canonical envelope (what the
// service stores and delivers), "" when it has none, without parsing the
// document: the delivery worker reads it on every attempt, and a payload can
// be a MiB.
//
// In the canonical form members are sorted, so the top-level "metadata"
// comes before "payload" and only event_id, idempotency_key, issued_at and
// key_id precede it; "metadata":{ cannot occur inside any string (its
// second quote would be escaped), so its first occurrence is the envelope's.
// The metadata object holds only strings whose rules exclude '}' and '"', so
// it ends at the first '}'. The value found is returned only if it is a
// valid version-00 traceparent. For a document that is not canonical the
// answer is unspecified (but is always "" or a valid traceparent).
func TraceparentOf(canonical []byte) string {
	i := bytes.Index(canonical, metadataOpen)
	if i < 0 {
		return ""
	}
	md := canonical[i+len(metadataOpen):]
	if end := bytes.IndexByte(md, '}'); end >= 0 {
		md = md[:end]
	}
	j := bytes.Index(md, traceparentMember)
	if j < 0 {
		return ""
	}
	v := md[j+len(traceparentMember):]
	const n = 55
	if len(v) < n+1 || v[n] != '"' || !validTraceparent(v[:n]) {
		return ""
	}
	return string(v[:n])
}
