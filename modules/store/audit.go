package store

import (
	"context"
	"database/sql"
	"time"
)

// AuditRecord is one audit row (contract §3). Empty strings mean "not known".
type AuditRecord struct {
	TenantID, ProjectID, AccountID, DeviceID, EventIdentity, Outcome, Reason, CorrelationID string
	At                                                                                      time.Time
	ID                                                                                      int64
}

// AuditFilter selects a tenant's audit rows, newest first. ProjectID narrows
// to one project, Outcome to one outcome code, Since and Until (zero: open)
// to rows at or after Since and before Until; BeforeID pages (pass the last
// ID seen); Limit defaults to 100 and may not exceed MaxAuditLimit.
type AuditFilter struct {
	TenantID, ProjectID string
	Outcome             string
	Since, Until        time.Time
	Limit               int
	BeforeID            int64
}

// MaxAuditLimit bounds one ListAudit page.
const MaxAuditLimit = 1000

const listAuditSQL = `
SELECT audit_id, project_id, account_id, device_id, event_identity, outcome, reason, correlation_id, at
FROM audit_events
WHERE tenant_id = $1
  AND ($2 = '' OR project_id = $2)
  AND ($3::bigint = 0 OR audit_id < $3::bigint)
  AND ($5::timestamptz IS NULL OR at >= $5::timestamptz)
  AND ($6::timestamptz IS NULL OR at < $6::timestamptz)
  AND ($7 = '' OR outcome = $7)
ORDER BY audit_id DESC
LIMIT $4`

// ListAudit returns audit rows newest first.
func (s *Inbound) ListAudit(ctx context.Context, f AuditFilter) ([]AuditRecord, error) {
	const op = "list audit"
	if f.Limit == 0 {
		f.Limit = 100
	}
	if !validIdentity(f.TenantID) || (f.ProjectID != "" && !validIdentity(f.ProjectID)) ||
		f.Limit < 0 || f.Limit > MaxAuditLimit || f.BeforeID < 0 ||
		(f.Outcome != "" && !codeRE.MatchString(f.Outcome)) ||
		(!f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until)) {
		return nil, newErr(op, ErrInvalid)
	}
	rows, err := s.sqlDB().QueryContext(ctx, listAuditSQL, f.TenantID, f.ProjectID, f.BeforeID, f.Limit,
		nullTime(f.Since), nullTime(f.Until), f.Outcome)
	if err != nil {
		return nil, classify(ctx, op, err)
	}
	defer rows.Close()
	var out []AuditRecord
	for rows.Next() {
		r := AuditRecord{TenantID: f.TenantID}
		if err := rows.Scan(&r.ID, &r.ProjectID, &r.AccountID, &r.DeviceID, &r.EventIdentity,
			&r.Outcome, &r.Reason, &r.CorrelationID, &r.At); err != nil {
			return nil, classify(ctx, op, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, classify(ctx, op, err)
	}
	return out, nil
}

// nullTime is NULL for the zero time: an open end of a range.
func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }
