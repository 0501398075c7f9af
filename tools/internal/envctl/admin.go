package envctl

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// pageFlags are --limit and --after of the id-ordered listings (endpoint, key and credential list).
type pageFlags struct {
	limit int
	after string
}

func addPageFlags(fs *flag.FlagSet, what string) *pageFlags {
	p := &pageFlags{}
	fs.IntVar(&p.limit, "limit", 100, fmt.Sprintf("at most this many %s, in id order (1-%d)", what, store.MaxAdminPage))
	fs.StringVar(&p.after, "after", "", "continue after this id (the next_after a previous page printed on stderr)")
	return p
}

func (p *pageFlags) check() error {
	if p.limit < 1 || p.limit > store.MaxAdminPage {
		return fmt.Errorf("--limit %d is outside 1-%d", p.limit, store.MaxAdminPage)
	}
	if len(p.after) > maxObjectID {
		return fmt.Errorf("--after is longer than %d bytes: not an id printed by a listing", maxObjectID)
	}
	return nil
}

// printLines writes one JSON object a line and, when the page was full, the cursor of the next page on
// stderr (stdout stays one object a line for jq and friends).
func printLines[T any](c *cli, path string, items []T, limit int, line func(T) (any, string)) int {
	enc := json.NewEncoder(c.Stdout)
	last := ""
	for _, it := range items {
		v, id := line(it)
		if err := enc.Encode(v); err != nil {
			return c.failure(path, "write: %v", err)
		}
		last = id
	}
	if len(items) == limit && last != "" {
		fmt.Fprintf(c.Stderr, "next_after %s\n", last)
	}
	return ExitOK
}

// listing is one id-ordered tenant listing (endpoint, key and credential list): --tenant, the page
// flags, the database flags and its own, then one page printed by printLines.
type listing[T any] struct {
	what string // what is listed, for --limit's help: "keys"
	// flags adds the listing's own flags to fs and returns their check (run after parse), or nil.
	flags func(fs *flag.FlagSet) (check func() error)
	// list reads one page of the concern that holds the rows.
	list func(s *store.Store, ctx context.Context, page store.AdminPage) ([]T, error)
	line func(T) (v any, id string) // the JSON line and the id --after continues from
}

func (l listing[T]) run(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	var check func() error
	if l.flags != nil {
		check = l.flags(fs)
	}
	p := addPageFlags(fs, l.what)
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if err := p.check(); err != nil {
		return c.usageError(path, "%v", err)
	}
	if check != nil {
		if err := check(); err != nil {
			return c.usageError(path, "%v", err)
		}
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	items, err := l.list(s, cctx, store.AdminPage{TenantID: fs.Lookup("tenant").Value.String(), After: p.after, Limit: p.limit})
	if err != nil {
		return c.storeFailure(path, err)
	}
	return printLines(c, path, items, p.limit, l.line)
}

func runEndpointList(ctx context.Context, c *cli, path string, args []string) int {
	var project *string
	return listing[store.Endpoint]{
		what: "endpoints",
		flags: func(fs *flag.FlagSet) func() error {
			project = fs.String("project", "", "only endpoints of this project")
			return func() error {
				if *project != "" {
					return checkIdentities(fs, "project")
				}
				return nil
			}
		},
		list: func(s *store.Store, ctx context.Context, page store.AdminPage) ([]store.Endpoint, error) {
			return s.Outbox().ListEndpoints(ctx, page, *project)
		},
		line: func(e store.Endpoint) (any, string) { return newEndpointLine(e), e.ID },
	}.run(ctx, c, path, args)
}

func runEndpointUpdate(ctx context.Context, c *cli, path string, args []string) int {
	o := endpointFlags(c, path)
	rawURL := o.fs.String("url", "", "new URL, checked as by endpoint add")
	secretRef := o.fs.String("secret-ref", "", "new secret ref, checked as by endpoint add")
	tenant, id, done, code := o.parse(c, path, args)
	if done {
		return code
	}
	if *rawURL == "" && *secretRef == "" {
		return c.usageError(path, "nothing to update: give --url, --secret-ref or both")
	}
	if *rawURL != "" {
		if err := checkEndpointURL(*rawURL); err != nil {
			return c.usageError(path, "%v", err)
		}
	}
	if *secretRef != "" {
		if err := checkSecretRef(*secretRef); err != nil {
			return c.usageError(path, "%v", err)
		}
	}
	s, cctx, cancel, code := c.open(ctx, path, o.db)
	if s == nil {
		return code
	}
	defer cancel()
	if err := s.Outbox().UpdateEndpoint(cctx, tenant, id, *rawURL, *secretRef); err != nil {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return c.failure(path, "no endpoint %q in tenant %s", id, tenant)
		case errors.Is(err, store.ErrSecretRefForeign):
			return c.failure(path, "%s", secretRefForeignMessage(*secretRef, tenant))
		case errors.Is(err, store.ErrInvalid):
			return c.failure(path, "refused: %v", err)
		}
		return c.storeFailure(path, err)
	}
	e, err := s.Outbox().GetEndpoint(cctx, tenant, id)
	if err != nil {
		return c.storeFailure(path, err)
	}
	return c.printJSON(path, newEndpointLine(e))
}

// keyLine is one line of `key list`. The public key is public; it is printed as key add takes it.
type keyLine struct {
	KeyID     string  `json:"key_id"`
	TenantID  string  `json:"tenant_id"`
	PublicKey string  `json:"public_key"`
	State     string  `json:"state"`
	CreatedAt string  `json:"created_at"`
	RetiredAt *string `json:"retired_at"`
	RevokedAt *string `json:"revoked_at"`
}

func newKeyLine(k store.Key) (any, string) {
	return keyLine{KeyID: k.KeyID, TenantID: k.TenantID, PublicKey: base64.RawURLEncoding.EncodeToString(k.PublicKey),
		State: string(k.State), CreatedAt: formatTime(k.CreatedAt), RetiredAt: formatTimePtr(k.RetiredAt),
		RevokedAt: formatTimePtr(k.RevokedAt)}, k.KeyID
}

func runKeyList(ctx context.Context, c *cli, path string, args []string) int {
	keys := listing[store.Key]{what: "keys", list: func(s *store.Store, ctx context.Context, page store.AdminPage) ([]store.Key, error) {
		return s.Credentials().ListKeys(ctx, page)
	}, line: newKeyLine}
	return keys.run(ctx, c, path, args)
}

// credentialLine is one line of `credential list`: no token, no digest (neither can be shown).
type credentialLine struct {
	CredentialID string  `json:"credential_id"`
	TenantID     string  `json:"tenant_id"`
	AccountID    string  `json:"account_id"`
	DeviceID     string  `json:"device_id"`
	Role         string  `json:"role"`
	Status       string  `json:"status"`
	CreatedAt    string  `json:"created_at"`
	RevokedAt    *string `json:"revoked_at"`
}

func newCredentialLine(cr store.Credential) (any, string) {
	return credentialLine{CredentialID: cr.ID, TenantID: cr.TenantID, AccountID: cr.AccountID, DeviceID: cr.DeviceID,
		Role: string(cr.Role), Status: string(cr.Status), CreatedAt: formatTime(cr.CreatedAt),
		RevokedAt: formatTimePtr(cr.RevokedAt)}, cr.ID
}

func runCredentialList(ctx context.Context, c *cli, path string, args []string) int {
	credentials := listing[store.Credential]{what: "credentials",
		list: func(s *store.Store, ctx context.Context, page store.AdminPage) ([]store.Credential, error) {
			return s.Credentials().ListCredentials(ctx, page)
		}, line: newCredentialLine}
	return credentials.run(ctx, c, path, args)
}

// migrationLine is one line of `migrate status` and `migrate --dry-run`.
type migrationLine struct {
	Version          int     `json:"version"`
	Name             string  `json:"name"`
	State            string  `json:"state"`
	EmbeddedChecksum *string `json:"embedded_checksum"`
	AppliedChecksum  *string `json:"applied_checksum"`
	AppliedAt        *string `json:"applied_at"`
}

func newMigrationLine(e migrations.StatusEntry) migrationLine {
	return migrationLine{Version: e.Version, Name: e.Name, State: string(e.State),
		EmbeddedChecksum: orNull(e.EmbeddedChecksum), AppliedChecksum: orNull(e.AppliedChecksum),
		AppliedAt: formatTimePtr(e.AppliedAt)}
}

// migrationStatus opens dsn and reads the status; migrate status and migrate --dry-run share it.
func (c *cli) migrationStatus(ctx context.Context, path, dsn string) ([]migrations.StatusEntry, int) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, c.failure(path, "cannot open the database: %v", err)
	}
	defer db.Close()
	st, err := migrations.Status(ctx, db)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, c.failure(path, "timed out (see --timeout): %v", err)
		}
		return nil, c.failure(path, "%v", err)
	}
	return st, ExitOK
}

func runMigrateStatus(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	d := c.addDBFlags(fs, time.Minute)
	dsn, cctx, cancel, code := c.parseDSN(ctx, fs, path, args, d)
	if dsn == "" {
		return code
	}
	defer cancel()
	st, code := c.migrationStatus(cctx, path, dsn)
	if st == nil {
		return code
	}
	if db, err := sql.Open("pgx", dsn); err == nil {
		c.layoutNote(cctx, db)
		db.Close()
	}
	enc := json.NewEncoder(c.Stdout)
	modified := 0
	for _, e := range st {
		if err := enc.Encode(newMigrationLine(e)); err != nil {
			return c.failure(path, "write: %v", err)
		}
		if e.State == migrations.StateModified {
			modified++
		}
	}
	if modified > 0 {
		// The same condition makes migrate refuse; say it here too, with a failing exit for scripts.
		return c.failure(path, "%d applied migration(s) differ from this build's files (state modified); migrate refuses to run", modified)
	}
	return ExitOK
}

// migrateDryRun prints the migrations migrate would apply, one JSON object a line, and applies nothing.
func (c *cli) migrateDryRun(ctx context.Context, path, dsn string, layout migrations.Layout) int {
	st, code := c.migrationStatus(ctx, path, dsn)
	if st == nil {
		return code
	}
	if layout != "" {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return c.failure(path, "cannot open the database: %v", err)
		}
		have, _, err := migrations.CurrentLayout(ctx, db)
		db.Close()
		if err != nil {
			return c.failure(path, "%v", err)
		}
		if have != "" && have != layout && hasApplied(st) {
			return c.failure(path, "%v: it is %s, %s was asked for; migrate would refuse", migrations.ErrLayoutChange, have, layout)
		}
	}
	enc := json.NewEncoder(c.Stdout)
	pending := 0
	for _, e := range st {
		if e.State == migrations.StateModified {
			return c.failure(path, "migration %d (%s) was applied from a different file; migrate would refuse (see migrate status)", e.Version, e.Name)
		}
	}
	for _, e := range st {
		if e.State != migrations.StatePending {
			continue
		}
		if err := enc.Encode(newMigrationLine(e)); err != nil {
			return c.failure(path, "write: %v", err)
		}
		pending++
	}
	fmt.Fprintf(c.Stderr, "dry run: %d migration(s) would be applied; nothing was changed\n", pending)
	return ExitOK
}

// checkEndpointURL and checkSecretRef are the checks of endpoint add and endpoint update, before any
// database is opened. Neither echoes the value: a refused URL may carry user info (a password), and a
// refused ref may be a secret pasted by mistake.
func checkEndpointURL(raw string) error {
	if err := store.ValidateEndpointURL(raw); err != nil {
		return fmt.Errorf("--url refused: %w", err)
	}
	return nil
}

func checkSecretRef(ref string) error {
	if !store.ValidSecretRef(ref) {
		return errors.New("--secret-ref is not a valid name (1-128 of A-Z a-z 0-9 . _ : / -, starting with a letter or digit)")
	}
	if strings.HasPrefix(ref, "whsec_") || strings.HasPrefix(ref, "whsk_") {
		return errors.New("--secret-ref names a key of WEBHOOK_SECRETS_FILE; it must not be the secret itself")
	}
	return nil
}

// secretRefForeignMessage never says whose the ref is: the operator of one tenant learns nothing about
// another.
func secretRefForeignMessage(ref, tenant string) string {
	return fmt.Sprintf("refused: secret ref %s is not tenant %s's: another tenant's endpoints name it, "+
		"and a ref belongs to one tenant; choose another name (docs/operations.md, webhook secrets)", ref, tenant)
}

func hasApplied(st []migrations.StatusEntry) bool {
	for _, e := range st {
		if e.State != migrations.StatePending {
			return true
		}
	}
	return false
}

// layoutNote tells the operator the database's layout (migrations/layout.go) on stderr, beside
// the other notes, so that stdout keeps its format.
func (c *cli) layoutNote(ctx context.Context, db *sql.DB) {
	l, recorded, err := migrations.CurrentLayout(ctx, db)
	switch {
	case err != nil:
		fmt.Fprintf(c.Stderr, "note: could not read the layout: %v\n", err)
	case l == "":
		fmt.Fprintln(c.Stderr, "layout: none yet (migrate --layout chooses it; plain by default)")
	case l == migrations.LayoutPartitioned:
		fmt.Fprintf(c.Stderr, "layout: partitioned (large tables hash-partitioned by tenant_id into %d)\n", migrations.Partitions)
	case !recorded:
		fmt.Fprintln(c.Stderr, "layout: plain (migrated before layouts were recorded; the next migrate records it)")
	default:
		fmt.Fprintln(c.Stderr, "layout: plain")
	}
}
