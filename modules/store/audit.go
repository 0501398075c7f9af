package store

import (
	"context"
	"database/sql"
	"time"

	"github.com/uptrace/bun"
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

// auditModel is an audit row as the listing reads it. Rows are written only
// by the ingest and outbox statements (insertAuditSQL and the set-based
// writes), in the transaction of what they record.
type auditModel struct {
	bun.BaseModel `bun:"table:audit_events"`

	TenantID      string    `bun:"tenant_id"`
	AuditID       int64     `bun:"audit_id"`
	ProjectID     string    `bun:"project_id"`
	AccountID     string    `bun:"account_id"`
	DeviceID      string    `bun:"device_id"`
	EventIdentity string    `bun:"event_identity"`
	Outcome       string    `bun:"outcome"`
	Reason        string    `bun:"reason"`
	CorrelationID string    `bun:"correlation_id"`
	At            time.Time `bun:"at"`
}

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
	a := auditQueryArgs{tenant: f.TenantID, limit: f.Limit}
	if f.ProjectID != "" {
		a.project = f.ProjectID
	}
	if f.BeforeID != 0 {
		a.before = f.BeforeID
	}
	if !f.Since.IsZero() {
		a.since = f.Since
	}
	if !f.Until.IsZero() {
		a.until = f.Until
	}
	if f.Outcome != "" {
		a.outcome = f.Outcome
	}
	var rows []auditModel
	if err := listAuditQuery(s.db, &rows, a).Scan(ctx); err != nil {
		return nil, classify(ctx, op, err)
	}
	var out []AuditRecord
	for _, r := range rows {
		out = append(out, AuditRecord{TenantID: r.TenantID, ProjectID: r.ProjectID, AccountID: r.AccountID,
			DeviceID: r.DeviceID, EventIdentity: r.EventIdentity, Outcome: r.Outcome, Reason: r.Reason,
			CorrelationID: r.CorrelationID, At: r.At, ID: r.AuditID})
	}
	return out, nil
}

// auditQueryArgs are the values of one audit listing; a nil one is no
// filter. They are any so that the plan tests can render the query with
// parameters.
type auditQueryArgs struct {
	tenant, project, before, since, until, outcome any
	limit                                          int
}

// listAuditQuery selects one page of a tenant's audit rows into model,
// newest first (audit_id DESC, the key's order within the tenant).
func listAuditQuery(db *bun.DB, model any, a auditQueryArgs) *bun.SelectQuery {
	q := db.NewSelect().Model(model).Where("tenant_id = ?", a.tenant)
	if a.project != nil {
		q = q.Where("project_id = ?", a.project)
	}
	if a.before != nil {
		q = q.Where("audit_id < ?", a.before)
	}
	if a.since != nil {
		q = q.Where("at >= ?", a.since)
	}
	if a.until != nil {
		q = q.Where("at < ?", a.until)
	}
	if a.outcome != nil {
		q = q.Where("outcome = ?", a.outcome)
	}
	return q.OrderExpr("audit_id DESC").Limit(a.limit)
}

// nullTime is NULL for the zero time: an open end of a range.
func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }
