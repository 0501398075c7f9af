package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/uptrace/bun"
)

// EndpointState is whether an endpoint receives deliveries.
type EndpointState string

const (
	EndpointActive   EndpointState = "active"
	EndpointDisabled EndpointState = "disabled"
)

// Valid reports whether st is one of the two states.
func (st EndpointState) Valid() bool { return st == EndpointActive || st == EndpointDisabled }

// Endpoint is a service-owned webhook destination for one (tenant, project,
// topic). Deliveries go only to these rows; SecretRef names the signing
// secrets in the worker's configuration (no secret is stored).
type Endpoint struct {
	TenantID, ID, ProjectID, Topic, URL, SecretRef string
	State                                          EndpointState
	DisabledReason                                 string
	CreatedAt                                      time.Time
}

// topicRE is the outbox topic rule (the contract names topics like
// "task.proposals" without fixing a grammar): the identity rule, longer.
var topicRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// secretRefRE names a key of the worker's secrets file; printable and
// log-safe because it is a name, not a secret.
var secretRefRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`)

var endpointIDRE = regexp.MustCompile(`^ep_[0-9a-f]{24}$`)

// ValidTopic reports whether topic is a well-formed outbox topic.
func ValidTopic(topic string) bool { return topicRE.MatchString(topic) }

// ValidSecretRef reports whether ref is a well-formed secret reference.
func ValidSecretRef(ref string) bool { return secretRefRE.MatchString(ref) }

func urlErr(msg string) error { return newErr("endpoint url: "+msg, ErrInvalid) }

// ValidateEndpointURL checks an endpoint URL before it is stored: https, a
// host, no user info (credentials in URLs end up in logs), no fragment (never
// sent), at most MaxEndpointURL bytes. Plain http is accepted only for
// loopback hosts (127.0.0.0/8, [::1], localhost) so local runs and tests can
// register a listener; the worker still refuses those unless told otherwise.
// Whether a name resolves to a private address is the worker's check at each
// attempt, since DNS answers change. The error wraps ErrInvalid and its
// message never repeats the URL, so it is safe to print.
func ValidateEndpointURL(raw string) error {
	if raw == "" {
		return urlErr("empty")
	}
	if len(raw) > MaxEndpointURL {
		return urlErr("longer than 2048 bytes")
	}
	for i := 0; i < len(raw); i++ {
		if c := raw[i]; c <= 0x20 || c >= 0x7f {
			return urlErr("must be ASCII without spaces or control characters")
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return urlErr("not a URL")
	}
	if u.Opaque != "" || u.Host == "" {
		return urlErr("host missing")
	}
	if u.User != nil {
		return urlErr("user info not allowed")
	}
	if u.Fragment != "" || strings.Contains(raw, "#") {
		return urlErr("fragment not allowed")
	}
	host := u.Hostname()
	if host == "" {
		return urlErr("host missing")
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return urlErr("bad port")
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return urlErr("bad port")
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if isLoopbackHost(host) {
			return nil
		}
		return urlErr("http is allowed only for loopback hosts")
	default:
		return urlErr("scheme must be https")
	}
}

// isLoopbackHost is the contract's list: localhost, 127.0.0.0/8 and ::1.
// IPv4-mapped forms (::ffff:127.0.0.1) are not on it.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return false
	}
	return (a.Is4() && a.IsLoopback()) || a == netip.IPv6Loopback()
}

func newID(prefix string) (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return prefix + hex.EncodeToString(b), nil
}

// The fan-out guard (contract §8.12): a (tenant, project, topic) has at most
// MaxTopicEndpoints active endpoints. Adding an active endpoint and enabling
// one each run in a transaction that takes a transaction-scoped advisory lock
// on the triple, then counts the other active endpoints, then writes. The
// lock makes two writers of one topic take turns; under READ COMMITTED (inTx
// asks for it) the count, a statement after the lock was granted, sees what
// the previous holder committed, so of two racing for the last slot exactly
// one gets it. An advisory lock rather than a row lock because no table has a
// row per topic, and the guard needs no migration. The two-key form with its
// own class keeps these locks apart from the single-key ones (the migrator,
// the janitor); a hash collision of two triples only makes them take turns.
// The endpoints trigger of migration 0005 runs inside the insert, after the
// lock: every writer takes the topic lock before any secret_ref_owners row,
// so the two cannot wait on each other in a cycle. The worker's 410 disable
// and operator disables only lower the count and take no lock.
const (
	topicLockClass = 0x45570001 // "EW" 0001: the fan-out guard's advisory lock class

	// lockTopicSQL stays SQL: an advisory lock is a function call, not a
	// query over a model.
	lockTopicSQL = `SELECT pg_advisory_xact_lock($1, hashtext($2 || '/' || $3 || '/' || $4))`
)

// guardTopic takes the topic's lock and refuses with ErrTopicFull when the
// topic has MaxTopicEndpoints active endpoints besides id. Identities and
// topic are validated (no '/'), so the lock key's text is unambiguous.
func guardTopic(ctx context.Context, db *bun.DB, tx *sql.Tx, op, tenant, project, topic, id string) error {
	if _, err := tx.ExecContext(ctx, lockTopicSQL, topicLockClass, tenant, project, topic); err != nil {
		return err
	}
	// Counts the other active endpoints only up to the bound: the guard asks
	// only whether it is reached.
	others := db.NewSelect().Model((*endpointModel)(nil)).ColumnExpr("1").
		Where("tenant_id = ?", tenant).Where("project_id = ?", project).Where("topic = ?", topic).
		Where("state = ?", string(EndpointActive)).Where("endpoint_id <> ?", id).Limit(MaxTopicEndpoints)
	var n int
	if err := db.NewSelect().Conn(tx).TableExpr("(?) AS a", others).ColumnExpr("count(*)").Scan(ctx, &n); err != nil {
		return err
	}
	if n >= MaxTopicEndpoints {
		return newErr(op, ErrTopicFull)
	}
	return nil
}

// AddEndpoint stores an endpoint and returns its id. e.ID may be empty (a new
// id is made) or a caller-chosen id of the form ep_<24 hex>, which is
// ErrConflict when taken. e.State defaults to active. Bad fields are
// ErrInvalid (see ValidateEndpointURL for the URL). A secret ref belongs to
// the first tenant whose endpoint names it: another tenant's ref (or one
// several tenants shared before migration 0005) is ErrSecretRefForeign. The
// schema decides that, for every writer, in a trigger on endpoints
// (migrations/0005), race-free: of two tenants adding one new ref at once,
// exactly one gets it. An active endpoint for a topic that has
// MaxTopicEndpoints active ones already is ErrTopicFull (see guardTopic); a
// disabled one is always taken.
func (s *Outbox) AddEndpoint(ctx context.Context, e Endpoint) (string, error) {
	const op = "add endpoint"
	if e.State == "" {
		e.State = EndpointActive
	}
	if !validIdentity(e.TenantID, e.ProjectID) || !ValidTopic(e.Topic) || !ValidSecretRef(e.SecretRef) ||
		!e.State.Valid() || (e.ID != "" && !endpointIDRE.MatchString(e.ID)) ||
		(e.DisabledReason != "" && !codeRE.MatchString(e.DisabledReason)) {
		return "", newErr(op, ErrInvalid)
	}
	if err := ValidateEndpointURL(e.URL); err != nil {
		return "", err
	}
	if e.State == EndpointActive {
		e.DisabledReason = ""
	}
	id := e.ID
	if id == "" {
		var err error
		if id, err = newID("ep_"); err != nil {
			return "", classify(ctx, op, err)
		}
	}
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if e.State == EndpointActive {
			if err := guardTopic(ctx, s.db, tx, op, e.TenantID, e.ProjectID, e.Topic, id); err != nil {
				return err
			}
		}
		// A taken id inserts nothing (ErrConflict below), not a unique
		// violation; created_at is the table's default.
		res, err := s.db.NewInsert().Conn(tx).Model(&endpointModel{TenantID: e.TenantID, EndpointID: id,
			ProjectID: e.ProjectID, Topic: e.Topic, URL: e.URL, SecretRef: e.SecretRef, State: string(e.State),
			DisabledReason: e.DisabledReason}).
			Column("tenant_id", "endpoint_id", "project_id", "topic", "url", "secret_ref", "state", "disabled_reason").
			On("CONFLICT (tenant_id, endpoint_id) DO NOTHING").Exec(ctx)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return newErr(op, ErrConflict)
		}
		return nil
	})
	if err != nil {
		return "", classify(ctx, op, err)
	}
	return id, nil
}

// SetEndpointState enables or disables an endpoint. reason is a short code
// kept while disabled (for example "http_410" or "operator"); enabling clears
// it. Setting the current state again is not an error. Unknown ids, and ids
// of other tenants, are ErrNotFound. Messages of a disabled endpoint stay
// pending and are claimed again once it is enabled. Enabling an endpoint
// whose topic has MaxTopicEndpoints other active endpoints is ErrTopicFull
// (see guardTopic).
func (s *Outbox) SetEndpointState(ctx context.Context, tenant, id string, state EndpointState, reason string) error {
	const op = "set endpoint state"
	if !validIdentity(tenant) || !state.Valid() || (reason != "" && !codeRE.MatchString(reason)) {
		return newErr(op, ErrInvalid)
	}
	if !endpointIDRE.MatchString(id) {
		return newErr(op, ErrNotFound)
	}
	if state == EndpointDisabled {
		return classify(ctx, op, setEndpointState(ctx, s.db.NewUpdate(), op, tenant, id, state, reason))
	}
	return classify(ctx, op, s.inTx(ctx, func(tx *sql.Tx) error {
		// The topic of an endpoint never changes (no role may update it), so
		// reading it before the lock is safe; its state is counted after.
		var e endpointModel
		err := s.db.NewSelect().Conn(tx).Model(&e).Column("project_id", "topic").
			Where("tenant_id = ?", tenant).Where("endpoint_id = ?", id).Scan(ctx)
		if errors.Is(err, sql.ErrNoRows) {
			return newErr(op, ErrNotFound)
		}
		if err != nil {
			return err
		}
		if err := guardTopic(ctx, s.db, tx, op, tenant, e.ProjectID, e.Topic, id); err != nil {
			return err
		}
		return setEndpointState(ctx, s.db.NewUpdate().Conn(tx), op, tenant, id, state, "")
	}))
}

// setEndpointState runs q, an update on the pool or in a transaction.
func setEndpointState(ctx context.Context, q *bun.UpdateQuery, op, tenant, id string, state EndpointState, reason string) error {
	res, err := q.Model((*endpointModel)(nil)).
		Set("state = ?", string(state)).Set("disabled_reason = ?", reason).Set("updated_at = now()").
		Where("tenant_id = ?", tenant).Where("endpoint_id = ?", id).Exec(ctx)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return newErr(op, ErrNotFound)
	}
	return nil
}

// GetEndpoint returns one endpoint of tenant; ErrNotFound otherwise.
func (s *Outbox) GetEndpoint(ctx context.Context, tenant, id string) (Endpoint, error) {
	const op = "get endpoint"
	if !validIdentity(tenant) {
		return Endpoint{}, newErr(op, ErrInvalid)
	}
	if !endpointIDRE.MatchString(id) {
		return Endpoint{}, newErr(op, ErrNotFound)
	}
	var m endpointModel
	err := s.db.NewSelect().Model(&m).Where("tenant_id = ?", tenant).Where("endpoint_id = ?", id).Scan(ctx)
	if errors.Is(err, sql.ErrNoRows) {
		return Endpoint{}, newErr(op, ErrNotFound)
	}
	if err != nil {
		return Endpoint{}, classify(ctx, op, err)
	}
	return m.endpoint(), nil
}
