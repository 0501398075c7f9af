package envctl

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver for migrate
)

// maxCredentialID is the longest id the store accepts (it issues "cred_" + 24 hex digits).
const maxCredentialID = 64

func runMigrate(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	dryRun := fs.Bool("dry-run", false, "print the migrations that would be applied, one JSON object a line, and apply none")
	layoutName := fs.String("layout", "", "the layout of a new database: plain (default) or partitioned (the large tables hash-partitioned by tenant); refused on a database migrated with the other one")
	d := c.addDBFlags(fs, 5*time.Minute)
	dsn, cctx, cancel, code := c.parseDSN(ctx, fs, path, args, d)
	if dsn == "" {
		return code
	}
	defer cancel()
	var layout migrations.Layout
	if *layoutName != "" {
		l, err := migrations.ParseLayout(*layoutName)
		if err != nil {
			return c.usageError(path, "--layout must be plain or partitioned")
		}
		layout = l
	}
	if *dryRun {
		return c.migrateDryRun(cctx, path, dsn, layout)
	}
	// migrate talks to the database directly rather than through store.Open: the store may expect a
	// schema that does not exist yet.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return c.failure(path, "cannot open the database: %v", err)
	}
	defer db.Close()
	applied, err := migrations.ApplyLayout(cctx, db, layout)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return c.failure(path, "timed out (see --timeout): %v", err)
		}
		return c.failure(path, "%v", err)
	}
	c.layoutNote(cctx, db)
	// What the database holds, not what this build embeds: a later release may have migrated it.
	v, err := migrations.Version(cctx, db)
	if err != nil {
		return c.failure(path, "%v", err)
	}
	switch {
	case len(applied) == 0 && v > migrations.Latest():
		// Migrations are additive (expand now, contract a release later), so a schema newer than this
		// envctl's is one its binaries run on: succeed without touching it, so that re-running an older
		// migrate Job in a rollback does not fail the rollback (docs/operations.md, "Rolling upgrades").
		fmt.Fprintf(c.Stdout, "schema is at version %d, newer than this envctl's %d; nothing to apply\n", v, migrations.Latest())
	case len(applied) == 0:
		fmt.Fprintf(c.Stdout, "schema is at version %d; nothing to apply\n", v)
	default:
		vs := make([]string, len(applied))
		for i, a := range applied {
			vs[i] = strconv.Itoa(a)
		}
		fmt.Fprintf(c.Stdout, "applied migration(s) %s; schema is at version %d\n", strings.Join(vs, ", "), v)
	}
	// Migration 0004 grants this only where the migrator may; its notice does not reach the operator.
	if note, err := walCompressionGrantNote(cctx, db, "envelopeworker_janitor"); err != nil {
		fmt.Fprintf(c.Stderr, "note: could not check the janitor's SET privilege on wal_compression: %v\n", err)
	} else if note != "" {
		fmt.Fprintln(c.Stderr, note)
	}
	// Migration 0005 leaves refs that several tenants shared without an owner; its notice does not
	// reach the operator either.
	if note, err := sharedSecretRefsNote(cctx, db); err != nil {
		fmt.Fprintf(c.Stderr, "note: could not list secret refs without an owner: %v\n", err)
	} else if note != "" {
		fmt.Fprintln(c.Stderr, note)
	}
	return ExitOK
}

// maxSharedRefsListed bounds the refs sharedSecretRefsNote names; the rest are counted.
const maxSharedRefsListed = 20

// sharedSecretRefsNote names the secret refs that belong to no tenant (several tenants' endpoints
// named them before migration 0005) and what that means; "" when there are none. Refs are names, not
// secrets, so they may be printed; the tenants that share them are not.
func sharedSecretRefsNote(ctx context.Context, db *sql.DB) (string, error) {
	rows, err := db.QueryContext(ctx, `SELECT secret_ref FROM secret_ref_owners WHERE tenant_id IS NULL ORDER BY secret_ref`)
	if err != nil {
		return "", fmt.Errorf("secret ref owners: %w", err)
	}
	defer rows.Close()
	var refs []string
	n := 0
	for rows.Next() {
		var ref string
		if err := rows.Scan(&ref); err != nil {
			return "", fmt.Errorf("secret ref owners: %w", err)
		}
		if n++; n <= maxSharedRefsListed {
			refs = append(refs, ref)
		}
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("secret ref owners: %w", err)
	}
	if n == 0 {
		return "", nil
	}
	if n > len(refs) {
		refs = append(refs, fmt.Sprintf("and %d more", n-len(refs)))
	}
	return fmt.Sprintf("note: %d secret ref(s) were named by endpoints of several tenants and belong to none: %s; "+
		"the delivery-worker refuses their messages (secret_ref_foreign) until each is given to one tenant "+
		"(docs/operations.md, webhook secrets)", n, strings.Join(refs, ", ")), nil
}

// walCompressionGrantNote says what to run when role may not SET wal_compression on a server that
// can grant it (PostgreSQL 15 on); "" when it may, or when the server cannot grant it at all.
func walCompressionGrantNote(ctx context.Context, db *sql.DB, role string) (string, error) {
	var v15 bool
	if err := db.QueryRowContext(ctx, `SELECT current_setting('server_version_num')::int >= 150000`).Scan(&v15); err != nil {
		return "", fmt.Errorf("server version: %w", err)
	}
	if !v15 {
		return "", nil
	}
	var granted bool
	if err := db.QueryRowContext(ctx, `SELECT has_parameter_privilege($1, 'wal_compression', 'SET')`, role).Scan(&granted); err != nil {
		return "", fmt.Errorf("parameter privilege: %w", err)
	}
	if granted {
		return "", nil
	}
	return fmt.Sprintf("note: %s may not SET wal_compression, so the retention-janitor's deletes write uncompressed page images "+
		"(twice the WAL); as a superuser run: GRANT SET ON PARAMETER wal_compression TO %s; (docs/operations.md)", role, role), nil
}

func runCredentialIssue(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	fs.String("account", "", "account id (required)")
	fs.String("device", "", "device id; for role device it is the producer_id its envelopes must carry (required)")
	fs.String("role", "", "device, service or operator (required)")
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "account", "device"); err != nil {
		return c.usageError(path, "%v", err)
	}
	role := store.Role(fs.Lookup("role").Value.String())
	switch role {
	case "device", "service", "operator":
	case "":
		return c.usageError(path, "--role is required")
	default:
		return c.usageError(path, "--role %q is not one of device, service, operator", role)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	tenant, device := fs.Lookup("tenant").Value.String(), fs.Lookup("device").Value.String()
	token, id, err := s.Credentials().IssueCredential(cctx, tenant, fs.Lookup("account").Value.String(), device, role)
	if err != nil {
		if errors.Is(err, store.ErrInvalid) {
			return c.failure(path, "refused: %v", err)
		}
		return c.storeFailure(path, err)
	}
	// stdout carries the token alone so `tok=$(envctl credential issue ...)` works; the id, which is not
	// secret and is what revoke takes, goes to stderr.
	fmt.Fprintln(c.Stdout, token)
	fmt.Fprintf(c.Stderr, "issued credential id %s (tenant %s, device %s, role %s); the token is shown only now\n", id, tenant, device, role)
	return ExitOK
}

func runCredentialRevoke(ctx context.Context, c *cli, path string, args []string) int {
	o := c.objectFlags(path, "a credential id", "credential id, as printed by credential issue", maxCredentialID)
	return o.run(ctx, c, path, args, "credential", func(ctx context.Context, s *store.Store, tenant, id string) (int, error) {
		if err := s.Credentials().RevokeCredential(ctx, tenant, id); err != nil {
			if errors.Is(err, store.ErrInvalid) { // an id of no credential's form
				return c.failure(path, "no credential %q in tenant %s", id, tenant), nil
			}
			return 0, err
		}
		fmt.Fprintf(c.Stdout, "revoked credential %s\n", id)
		return ExitOK, nil
	})
}

func runKeyAdd(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	fs.String("key-id", "", "key id envelopes name in key_id (required)")
	pubText := fs.String("public-key", "", "Ed25519 public key, base64url of 32 bytes, padding optional (required)")
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "key-id"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if *pubText == "" {
		return c.usageError(path, "--public-key is required")
	}
	pub, err := envelope.ParsePublicKey(*pubText)
	if err != nil {
		return c.usageError(path, "public key refused: %v", err)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	tenant, keyID := fs.Lookup("tenant").Value.String(), fs.Lookup("key-id").Value.String()
	if err := s.Credentials().AddKey(cctx, tenant, keyID, pub); err != nil {
		switch {
		case errors.Is(err, store.ErrConflict):
			return c.failure(path, "key id %s already exists in tenant %s (key ids are never reused; pick a new one)", keyID, tenant)
		case errors.Is(err, store.ErrInvalid):
			return c.failure(path, "public key refused: %v", err)
		}
		return c.storeFailure(path, err)
	}
	fmt.Fprintf(c.Stdout, "added key %s to tenant %s (active)\n", keyID, tenant)
	return ExitOK
}

func runKeyRetire(ctx context.Context, c *cli, path string, args []string) int {
	return keyTransition(ctx, c, path, args, "retired", (*store.Credentials).RetireKey)
}

func runKeyRevoke(ctx context.Context, c *cli, path string, args []string) int {
	return keyTransition(ctx, c, path, args, "revoked", (*store.Credentials).RevokeKey)
}

func keyTransition(ctx context.Context, c *cli, path string, args []string, state string,
	op func(*store.Credentials, context.Context, string, string) error) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	fs.String("key-id", "", "key id (required)")
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "key-id"); err != nil {
		return c.usageError(path, "%v", err)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	tenant, keyID := fs.Lookup("tenant").Value.String(), fs.Lookup("key-id").Value.String()
	if err := op(s.Credentials(), cctx, tenant, keyID); err != nil {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return c.failure(path, "no key %s in tenant %s", keyID, tenant)
		case errors.Is(err, store.ErrConflict):
			return c.failure(path, "key %s cannot be %s from its current state: %v", keyID, state, err)
		}
		return c.storeFailure(path, err)
	}
	fmt.Fprintf(c.Stdout, "key %s in tenant %s is %s\n", keyID, tenant, state)
	return ExitOK
}

func runKeyPrune(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	def := 2160 * time.Hour
	window := fs.Duration("replay-window", def, "the ingest replay window; a retired or revoked key goes only once every envelope it signed is older than this (default $REPLAY_WINDOW, else 2160h)")
	d := c.addDBFlags(fs, 5*time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if !flagSet(fs, "replay-window") {
		if env := c.Getenv("REPLAY_WINDOW"); env != "" {
			w, err := time.ParseDuration(env)
			if err != nil {
				return c.usageError(path, "REPLAY_WINDOW %q is not a Go duration", env)
			}
			*window = w
		}
	}
	if *window <= 0 {
		return c.usageError(path, "--replay-window must be positive")
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	n, err := s.Credentials().PruneKeys(cctx, *window)
	if err != nil {
		return c.storeFailure(path, err)
	}
	fmt.Fprintf(c.Stdout, "pruned %d key(s)\n", n)
	return ExitOK
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

func streamFlags(c *cli, path string) (*flag.FlagSet, *dbFlags) {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	fs.String("project", "", "project id (required)")
	fs.String("producer", "", "producer id, i.e. the device id (required)")
	return fs, c.addDBFlags(fs, time.Minute)
}

func printStream(c *cli, st store.StreamState) {
	fmt.Fprintf(c.Stdout, "{\"cursor\":%d,\"replay_floor\":%d}\n", st.Cursor, st.ReplayFloor)
}

func runStreamSetFloor(ctx context.Context, c *cli, path string, args []string) int {
	fs, d := streamFlags(c, path)
	floorText := fs.String("floor", "", "new replay floor: sequences up to N count as settled; must not be lower than the current floor (required)")
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "project", "producer"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if *floorText == "" {
		return c.usageError(path, "--floor is required")
	}
	floor, err := strconv.ParseInt(*floorText, 10, 64)
	if err != nil || floor < 0 || floor > envelope.MaxSequence {
		return c.usageError(path, "--floor %q must be an integer from 0 to %d", *floorText, int64(envelope.MaxSequence))
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	tenant, project, producer := fs.Lookup("tenant").Value.String(), fs.Lookup("project").Value.String(), fs.Lookup("producer").Value.String()
	st, err := s.Inbound().SetReplayFloor(cctx, tenant, project, producer, floor)
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			// The store returns the current state with the conflict.
			return c.failure(path, "refused: floor %d is lower than the stream's replay floor %d (floors only rise)", floor, st.ReplayFloor)
		}
		return c.storeFailure(path, err)
	}
	printStream(c, st)
	return ExitOK
}

func runStreamShow(ctx context.Context, c *cli, path string, args []string) int {
	fs, d := streamFlags(c, path)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "project", "producer"); err != nil {
		return c.usageError(path, "%v", err)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	st, err := s.Inbound().Stream(cctx, fs.Lookup("tenant").Value.String(), fs.Lookup("project").Value.String(), fs.Lookup("producer").Value.String())
	if err != nil {
		return c.storeFailure(path, err)
	}
	printStream(c, st)
	return ExitOK
}

// auditLine is one line of `audit list`: exactly the members of contract §7.3, null when unknown.
type auditLine struct {
	TenantID      string  `json:"tenant_id"`
	ProjectID     *string `json:"project_id"`
	AccountID     *string `json:"account_id"`
	DeviceID      *string `json:"device_id"`
	EventIdentity *string `json:"event_identity"`
	Outcome       string  `json:"outcome"`
	Reason        *string `json:"reason"`
	At            string  `json:"at"`
	CorrelationID *string `json:"correlation_id"`
}

func orNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

const maxAuditLimit = store.MaxAuditLimit

func runAuditList(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	project := fs.String("project", "", "only rows of this project")
	outcome := fs.String("outcome", "", "only rows with this outcome code, e.g. accepted, refused, replayed")
	sinceText := fs.String("since", "", "only rows at or after this time (RFC 3339, e.g. 2026-01-02T15:04:05Z)")
	untilText := fs.String("until", "", "only rows before this time (RFC 3339)")
	limit := fs.Int("limit", 100, fmt.Sprintf("at most this many rows, newest first (1-%d)", maxAuditLimit))
	after := fs.String("after", "", "continue after this cursor (the next_after a previous page printed on stderr)")
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if *project != "" {
		if err := checkIdentities(fs, "project"); err != nil {
			return c.usageError(path, "%v", err)
		}
	}
	if *outcome != "" && !store.ValidCode(*outcome) {
		return c.usageError(path, "--outcome %q is not an outcome code (a-z 0-9 _, starting with a letter)", *outcome)
	}
	if *limit < 1 || *limit > maxAuditLimit {
		return c.usageError(path, "--limit %d is outside 1-%d", *limit, maxAuditLimit)
	}
	since, err := parseTimeFlag("since", *sinceText)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	until, err := parseTimeFlag("until", *untilText)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	if !since.IsZero() && !until.IsZero() && !since.Before(until) {
		return c.usageError(path, "--since must be before --until")
	}
	var before int64
	if *after != "" {
		before, err = strconv.ParseInt(*after, 10, 64)
		if err != nil || before < 1 {
			return c.usageError(path, "--after is not a cursor printed by audit list")
		}
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	recs, err := s.Inbound().ListAudit(cctx, store.AuditFilter{TenantID: fs.Lookup("tenant").Value.String(), ProjectID: *project,
		Outcome: *outcome, Since: since, Until: until, Limit: *limit, BeforeID: before})
	if err != nil {
		return c.storeFailure(path, err)
	}
	enc := json.NewEncoder(c.Stdout)
	for _, r := range recs {
		line := auditLine{
			TenantID: r.TenantID, ProjectID: orNull(r.ProjectID), AccountID: orNull(r.AccountID),
			DeviceID: orNull(r.DeviceID), EventIdentity: orNull(r.EventIdentity), Outcome: r.Outcome,
			Reason: orNull(r.Reason), At: r.At.UTC().Format(time.RFC3339Nano), CorrelationID: orNull(r.CorrelationID),
		}
		if err := enc.Encode(line); err != nil {
			return c.failure(path, "write: %v", err)
		}
	}
	// A full page may have more behind it; the cursor is the audit id, which the lines (exactly the
	// members of contract §7.3) do not carry.
	if len(recs) == *limit {
		fmt.Fprintf(c.Stderr, "next_after %d\n", recs[len(recs)-1].ID)
	}
	return ExitOK
}

// parseTimeFlag reads an RFC 3339 time; "" is the zero time (no bound).
func parseTimeFlag(name, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", name, v)
	}
	return t, nil
}
