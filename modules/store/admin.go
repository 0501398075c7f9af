package store

import (
	"context"
	"crypto/ed25519"
	"time"

	"github.com/uptrace/bun"
)

// The operator's listings (envctl endpoint list, key list, credential list)
// and endpoint update. They are bun models and queries: plain CRUD over one
// table each, read a page at a time in primary-key order (tenant_id, then
// the id), so every page is a range scan of the primary key whatever the
// table's size or statistics.

// AdminPage selects one page of a tenant's rows in id order: After is the
// last id of the previous page ("" for the first); Limit is 1..MaxAdminPage.
type AdminPage struct {
	TenantID string
	After    string
	Limit    int
}

func (p AdminPage) valid() bool {
	return validIdentity(p.TenantID) && p.Limit >= 1 && p.Limit <= MaxAdminPage && len(p.After) <= 128
}

// page narrows q to p, ordered by idColumn.
func (p AdminPage) apply(q *bun.SelectQuery, idColumn string) *bun.SelectQuery {
	q = q.Where("tenant_id = ?", p.TenantID)
	if p.After != "" {
		q = q.Where("? > ?", bun.Ident(idColumn), p.After)
	}
	return q.OrderExpr("? ASC", bun.Ident(idColumn)).Limit(p.Limit)
}

type endpointModel struct {
	bun.BaseModel `bun:"table:endpoints"`

	TenantID       string    `bun:"tenant_id"`
	EndpointID     string    `bun:"endpoint_id"`
	ProjectID      string    `bun:"project_id"`
	Topic          string    `bun:"topic"`
	URL            string    `bun:"url"`
	SecretRef      string    `bun:"secret_ref"`
	State          string    `bun:"state"`
	DisabledReason string    `bun:"disabled_reason"`
	CreatedAt      time.Time `bun:"created_at"`
}

func (r endpointModel) endpoint() Endpoint {
	return Endpoint{TenantID: r.TenantID, ID: r.EndpointID, ProjectID: r.ProjectID, Topic: r.Topic,
		URL: r.URL, SecretRef: r.SecretRef, State: EndpointState(r.State), DisabledReason: r.DisabledReason,
		CreatedAt: r.CreatedAt}
}

// ListEndpoints returns a page of the tenant's endpoints in id order, of one
// project when project is not "". Bad arguments are ErrInvalid.
func (s *Outbox) ListEndpoints(ctx context.Context, p AdminPage, project string) ([]Endpoint, error) {
	const op = "list endpoints"
	if !p.valid() || (project != "" && !validIdentity(project)) {
		return nil, newErr(op, ErrInvalid)
	}
	var rows []endpointModel
	q := p.apply(s.db.NewSelect().Model(&rows), "endpoint_id")
	if project != "" {
		q = q.Where("project_id = ?", project)
	}
	if err := q.Scan(ctx); err != nil {
		return nil, classify(ctx, op, err)
	}
	out := make([]Endpoint, len(rows))
	for i, r := range rows {
		out[i] = r.endpoint()
	}
	return out, nil
}

// UpdateEndpoint moves an endpoint to a new URL, a new secret ref, or both
// ("" keeps the current value; both "" is ErrInvalid). The checks are
// AddEndpoint's: ValidateEndpointURL, ValidSecretRef, and the secret-ref
// owners trigger (migration 0005), so another tenant's ref is
// ErrSecretRefForeign. Its topic and state stay; messages already pending
// go to the new URL at their next attempt. Unknown ids are ErrNotFound.
func (s *Outbox) UpdateEndpoint(ctx context.Context, tenant, id, url, secretRef string) error {
	const op = "update endpoint"
	if !validIdentity(tenant) || (url == "" && secretRef == "") || (secretRef != "" && !ValidSecretRef(secretRef)) {
		return newErr(op, ErrInvalid)
	}
	if url != "" {
		if err := ValidateEndpointURL(url); err != nil {
			return err
		}
	}
	if !endpointIDRE.MatchString(id) {
		return newErr(op, ErrNotFound)
	}
	q := s.db.NewUpdate().Model((*endpointModel)(nil)).Set("updated_at = now()").
		Where("tenant_id = ?", tenant).Where("endpoint_id = ?", id)
	if url != "" {
		q = q.Set("url = ?", url)
	}
	if secretRef != "" {
		q = q.Set("secret_ref = ?", secretRef)
	}
	res, err := q.Exec(ctx)
	if err != nil {
		return classify(ctx, op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return classify(ctx, op, err)
	}
	if n == 0 {
		return newErr(op, ErrNotFound)
	}
	return nil
}

type keyModel struct {
	bun.BaseModel `bun:"table:producer_keys"`

	TenantID  string     `bun:"tenant_id"`
	KeyID     string     `bun:"key_id"`
	PublicKey []byte     `bun:"public_key"`
	State     string     `bun:"state"`
	CreatedAt time.Time  `bun:"created_at"`
	RetiredAt *time.Time `bun:"retired_at"`
	RevokedAt *time.Time `bun:"revoked_at"`
}

// ListKeys returns a page of the tenant's producer keys in key id order,
// whatever their state.
func (s *Credentials) ListKeys(ctx context.Context, p AdminPage) ([]Key, error) {
	const op = "list keys"
	if !p.valid() {
		return nil, newErr(op, ErrInvalid)
	}
	var rows []keyModel
	if err := p.apply(s.db.NewSelect().Model(&rows), "key_id").Scan(ctx); err != nil {
		return nil, classify(ctx, op, err)
	}
	out := make([]Key, len(rows))
	for i, r := range rows {
		out[i] = Key{TenantID: r.TenantID, KeyID: r.KeyID, PublicKey: ed25519.PublicKey(r.PublicKey),
			State: KeyState(r.State), CreatedAt: r.CreatedAt, RetiredAt: r.RetiredAt, RevokedAt: r.RevokedAt}
	}
	return out, nil
}

// CredentialStatus is whether a credential still verifies.
type CredentialStatus string

const (
	CredentialActive  CredentialStatus = "active"
	CredentialRevoked CredentialStatus = "revoked"
)

// Credential is what may be shown of a credential: never its token or the
// token's digest.
type Credential struct {
	TenantID, ID, AccountID, DeviceID string
	Role                              Role
	Status                            CredentialStatus
	CreatedAt                         time.Time
	RevokedAt                         *time.Time
}

// credentialModel names only the columns a listing may read: the digest is
// not a field, so no query built on it can select it.
type credentialModel struct {
	bun.BaseModel `bun:"table:credentials"`

	TenantID     string     `bun:"tenant_id"`
	CredentialID string     `bun:"credential_id"`
	AccountID    string     `bun:"account_id"`
	DeviceID     string     `bun:"device_id"`
	Role         string     `bun:"role"`
	Status       string     `bun:"status"`
	CreatedAt    time.Time  `bun:"created_at"`
	RevokedAt    *time.Time `bun:"revoked_at"`
}

// ListCredentials returns a page of the tenant's credentials in id order,
// active and revoked.
func (s *Credentials) ListCredentials(ctx context.Context, p AdminPage) ([]Credential, error) {
	const op = "list credentials"
	if !p.valid() {
		return nil, newErr(op, ErrInvalid)
	}
	var rows []credentialModel
	if err := p.apply(s.db.NewSelect().Model(&rows), "credential_id").Scan(ctx); err != nil {
		return nil, classify(ctx, op, err)
	}
	out := make([]Credential, len(rows))
	for i, r := range rows {
		out[i] = Credential{TenantID: r.TenantID, ID: r.CredentialID, AccountID: r.AccountID, DeviceID: r.DeviceID,
			Role: Role(r.Role), Status: CredentialStatus(r.Status), CreatedAt: r.CreatedAt, RevokedAt: r.RevokedAt}
	}
	return out, nil
}
