package envctl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// A draft file holds an envelope without its signature. It is read strictly (the envelope package's
// reader: no duplicate or case-folded member names, valid UTF-8) so that what gets signed is exactly
// what the author wrote, and every member is checked by name so a typo is an error rather than a
// silently missing field.
//
// Two conveniences: `issued_at` may be left out or be "now" (the signing time, whole seconds, UTC),
// which keeps checked-in demo drafts inside the replay window; `schema_version` may be left out, and
// when present must be 1, because envelope.Sign always writes version 1.

var draftMembers = map[string]bool{
	"schema_version": true, "tenant_id": true, "project_id": true, "producer_id": true, "event_id": true,
	"idempotency_key": true, "key_id": true, "sequence": true, "issued_at": true, "metadata": true,
	"payload": true,
}

var requiredDraftMembers = []string{
	"tenant_id", "project_id", "producer_id", "event_id", "idempotency_key", "key_id",
	"metadata", "payload",
}

// sequenced says whether drafts carry their sequence (envctl send on its own) or must leave it out
// (envctl send --state-file, where the producer module assigns sequences).
type sequenced bool

// parseDraft reads one draft object.
func parseDraft(data []byte, now time.Time, seq sequenced) (envelope.Draft, error) {
	canon, err := envelope.Canonicalize(data)
	if err != nil {
		return envelope.Draft{}, fmt.Errorf("draft is not acceptable JSON: %w", err)
	}
	return decodeDraft(canon, now, seq)
}

// parseDraftBatch reads a batch draft file: {"envelopes":[draft, ...]} or a bare array of drafts, with
// 1..envelope.MaxBatch drafts, each under the envelope limits on its own (as the server counts them).
func parseDraftBatch(data []byte, now time.Time, seq sequenced) ([]envelope.Draft, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '[' {
		wrapped := make([]byte, 0, len(data)+16)
		wrapped = append(wrapped, `{"envelopes":`...)
		wrapped = append(wrapped, data...)
		wrapped = append(wrapped, '}')
		data = wrapped
	}
	items, err := envelope.SplitBatch(data)
	if err != nil {
		return nil, fmt.Errorf("batch draft: %w", err)
	}
	drafts := make([]envelope.Draft, 0, len(items))
	for i, item := range items {
		d, err := parseDraft(item, now, seq)
		if err != nil {
			return nil, fmt.Errorf("batch draft item %d: %w", i, err)
		}
		drafts = append(drafts, d)
	}
	return drafts, nil
}

func decodeDraft(canon []byte, now time.Time, seq sequenced) (envelope.Draft, error) {
	var d envelope.Draft
	if len(canon) == 0 || canon[0] != '{' {
		return d, errors.New("draft must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(canon, &m); err != nil {
		return d, fmt.Errorf("draft must be a JSON object: %w", err)
	}
	if _, ok := m["signature"]; ok {
		return d, errors.New(`draft must not carry a "signature": it is signed when sent`)
	}
	var unknown []string
	for k := range m {
		if !draftMembers[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return d, fmt.Errorf("draft has unknown member(s) %s", quoteAll(unknown))
	}
	for _, k := range requiredDraftMembers {
		if _, ok := m[k]; !ok {
			return d, fmt.Errorf("draft lacks member %q", k)
		}
	}
	switch _, ok := m["sequence"]; {
	case bool(seq) && !ok:
		return d, errors.New(`draft lacks member "sequence"`)
	case !bool(seq) && ok:
		return d, errors.New(`draft must leave out "sequence": the producer's state file assigns it`)
	}
	if raw, ok := m["schema_version"]; ok && string(raw) != "1" {
		return d, errors.New(`draft "schema_version" must be 1 (or left out): only version 1 can be signed`)
	}
	strs := []struct {
		name string
		dst  *string
	}{
		{"tenant_id", &d.TenantID}, {"project_id", &d.ProjectID}, {"producer_id", &d.ProducerID},
		{"event_id", &d.EventID}, {"idempotency_key", &d.IdempotencyKey}, {"key_id", &d.KeyID},
	}
	for _, s := range strs {
		if err := json.Unmarshal(m[s.name], s.dst); err != nil {
			return d, fmt.Errorf("draft %q must be a string", s.name)
		}
	}
	if seq {
		if err := json.Unmarshal(m["sequence"], &d.Sequence); err != nil {
			return d, errors.New(`draft "sequence" must be an integer`)
		}
	}
	issued, err := draftIssuedAt(m["issued_at"], now)
	if err != nil {
		return d, err
	}
	d.IssuedAt = issued
	if d.Metadata, err = draftMetadata(m["metadata"]); err != nil {
		return d, err
	}
	d.Payload = append([]byte(nil), m["payload"]...)
	return d, nil
}

func draftIssuedAt(raw json.RawMessage, now time.Time) (time.Time, error) {
	if raw == nil {
		return now.UTC().Truncate(time.Second), nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return time.Time{}, errors.New(`draft "issued_at" must be a string`)
	}
	if s == "now" {
		return now.UTC().Truncate(time.Second), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !strings.HasSuffix(s, "Z") {
		return time.Time{}, errors.New(`draft "issued_at" must be RFC 3339 with Z (e.g. 2026-11-29T20:00:00Z) or "now"`)
	}
	return t, nil
}

func draftMetadata(raw json.RawMessage) (envelope.Metadata, error) {
	var md envelope.Metadata
	if len(raw) == 0 || raw[0] != '{' {
		return md, errors.New(`draft "metadata" must be an object`)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return md, errors.New(`draft "metadata" must be an object`)
	}
	fields := map[string]*string{"kind": &md.Kind, "correlation_id": &md.CorrelationID, "traceparent": &md.Traceparent}
	var unknown []string
	for k, v := range m {
		dst, ok := fields[k]
		if !ok {
			unknown = append(unknown, k)
			continue
		}
		if err := json.Unmarshal(v, dst); err != nil {
			return md, fmt.Errorf("draft metadata %q must be a string", k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return md, fmt.Errorf("draft metadata has unknown member(s) %s (allowed: kind, correlation_id, traceparent)", quoteAll(unknown))
	}
	return md, nil
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
