package envctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// Exit codes; see the package doc.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// Env is the process surroundings of one Run: tests supply buffers, a fixed environment and a clock.
type Env struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Getenv reads the environment (DATABASE_URL, REPLAY_WINDOW); nil reads nothing.
	Getenv func(string) string
	// Now is the clock used for drafts without issued_at; nil means time.Now.
	Now func() time.Time
	// HTTPClient is used by send; nil means a client with no overall timeout (send bounds each
	// request with its --timeout).
	HTTPClient *http.Client
}

type cli struct {
	Env
	// usage and example are the usage and example line of the leaf command being run, shown by its -h.
	usage, example string
}

type command struct {
	name    string
	summary string
	// usage is the flags of a leaf command, shown by -h after its path (a second form on a line of its
	// own, path included).
	usage string
	// example is one command line shown by -h; every leaf command has one (cli_test).
	example string
	run     func(ctx context.Context, c *cli, path string, args []string) int
	// subs are subcommands. A command with both run and subs (migrate) runs itself unless its first
	// argument names a subcommand.
	subs []*command
}

func commands() []*command {
	return []*command{
		{name: "migrate", summary: "apply the database migrations (idempotent); --dry-run lists what would run", run: runMigrate,
			usage: "[--dry-run] [--layout plain|partitioned] [--database-url URL]\n       envctl migrate status [--database-url URL]   (each migration's state and checksums)", example: "envctl migrate --dry-run && envctl migrate",
			subs: []*command{
				{name: "status", summary: "print every migration, applied or embedded, with its checksums, one JSON object a line", run: runMigrateStatus,
					usage: "[--database-url URL]", example: "envctl migrate status | jq -c 'select(.state != \"applied\")'"},
			}},
		{name: "credential", summary: "issue, list or revoke bearer credentials", subs: []*command{
			{name: "issue", summary: "issue a credential and print its token alone on one line", run: runCredentialIssue,
				usage: "--tenant T --account A --device D --role device|service|operator", example: "tok=$(envctl credential issue --tenant acme --account ops --device ops-cli --role operator)"},
			{name: "list", summary: "print a tenant's credentials (never their tokens), one JSON object a line", run: runCredentialList,
				usage: "--tenant T [--limit N] [--after CREDENTIAL_ID]", example: "envctl credential list --tenant acme | jq -c 'select(.status == \"active\")'"},
			{name: "revoke", summary: "revoke a credential by id", run: runCredentialRevoke,
				usage: "--tenant T --id ID", example: "envctl credential revoke --tenant acme --id cred_0123456789abcdef01234567"},
		}},
		{name: "key", summary: "manage producer Ed25519 public keys", subs: []*command{
			{name: "add", summary: "register a public key under a key id", run: runKeyAdd,
				usage: "--tenant T --key-id K --public-key BASE64URL", example: "envctl key add --tenant acme --key-id dev-1-2026 --public-key \"$(cat dev-1.pub)\""},
			{name: "list", summary: "print a tenant's keys in every state, one JSON object a line", run: runKeyList,
				usage: "--tenant T [--limit N] [--after KEY_ID]", example: "envctl key list --tenant acme --limit 100"},
			{name: "retire", summary: "retire a key (it still verifies envelopes issued up to now)", run: runKeyRetire,
				usage: "--tenant T --key-id K", example: "envctl key retire --tenant acme --key-id dev-1-2025"},
			{name: "revoke", summary: "revoke a key (it verifies only exact duplicates from now on)", run: runKeyRevoke,
				usage: "--tenant T --key-id K", example: "envctl key revoke --tenant acme --key-id dev-1-2025"},
			{name: "prune", summary: "delete retired/revoked keys whose envelopes are all older than the replay window", run: runKeyPrune,
				usage: "[--replay-window 2160h]", example: "envctl key prune --replay-window 2160h"},
		}},
		{name: "stream", summary: "inspect streams and raise replay floors", subs: []*command{
			{name: "set-floor", summary: "raise a stream's replay floor (never lowers)", run: runStreamSetFloor,
				usage: "--tenant T --project P --producer D --floor N", example: "envctl stream set-floor --tenant acme --project field --producer dev-1 --floor 5000"},
			{name: "show", summary: "print a stream's cursor and replay floor", run: runStreamShow,
				usage: "--tenant T --project P --producer D", example: "envctl stream show --tenant acme --project field --producer dev-1"},
		}},
		{name: "audit", summary: "read the audit stream", subs: []*command{
			{name: "list", summary: "print audit rows, newest first, one JSON object a line", run: runAuditList,
				usage: "--tenant T [--project P] [--outcome O] [--since TIME] [--until TIME] [--limit N] [--after CURSOR]", example: "envctl audit list --tenant acme --outcome replayed --since 2026-01-02T00:00:00Z --limit 50"},
		}},
		{name: "send", summary: "sign a draft envelope (or batch) and POST it to ingest-api", run: runSend,
			usage: "--url URL (--token-file F | --token T) --seed-file F --file DRAFT.json [--batch] [--state-file F]", example: "envctl send --url http://127.0.0.1:8080 --token-file tok --seed-file dev-1.seed --file draft.json"},
		{name: "keygen", summary: "make a new Ed25519 seed and print its public key", run: runKeygen,
			usage: "[--seed-file F]", example: "envctl keygen --seed-file dev-1.seed > dev-1.pub"},
		{name: "endpoint", summary: "manage webhook endpoints of the outbox", subs: []*command{
			{name: "add", summary: fmt.Sprintf("register an endpoint and print its id alone on one line; at most %d active a topic", store.MaxTopicEndpoints), run: runEndpointAdd,
				usage: "--tenant T --project P --topic X --url URL --secret-ref NAME", example: "envctl endpoint add --tenant acme --project field --topic task.proposals --url https://hooks.example.com/ew --secret-ref acme/hooks"},
			{name: "list", summary: "print a tenant's endpoints, one JSON object a line", run: runEndpointList,
				usage: "--tenant T [--project P] [--limit N] [--after ID]", example: "envctl endpoint list --tenant acme --project field"},
			{name: "update", summary: "move an endpoint to a new URL and/or secret ref (checked as on add)", run: runEndpointUpdate,
				usage: "--tenant T --id E [--url URL] [--secret-ref NAME]", example: "envctl endpoint update --tenant acme --id ep_0123456789abcdef01234567 --url https://hooks2.example.com/ew"},
			{name: "enable", summary: fmt.Sprintf("turn an endpoint on (also after a 410 Gone disabled it); at most %d active a topic", store.MaxTopicEndpoints), run: runEndpointEnable,
				usage: "--tenant T --id E", example: "envctl endpoint enable --tenant acme --id ep_0123456789abcdef01234567"},
			{name: "disable", summary: "turn an endpoint off (its messages wait, new enqueues skip it)", run: runEndpointDisable,
				usage: "--tenant T --id E", example: "envctl endpoint disable --tenant acme --id ep_0123456789abcdef01234567"},
			{name: "show", summary: "print an endpoint as one JSON object", run: runEndpointShow,
				usage: "--tenant T --id E", example: "envctl endpoint show --tenant acme --id ep_0123456789abcdef01234567"},
		}},
		{name: "dlq", summary: "list and replay dead letters", subs: []*command{
			{name: "list", summary: "print a project's dead letters, oldest first, one JSON object a line", run: runDLQList,
				usage: "--tenant T --project P [--limit N] [--after CURSOR]", example: "envctl dlq list --tenant acme --project field --limit 100"},
			{name: "replay", summary: "put one dead letter (--id), or a project's matching ones (--dry-run|--yes), back to pending", run: runDLQReplay,
				usage: "--tenant T --id M [--account A]\n       envctl dlq replay --tenant T --project P [--endpoint E] [--code C] [--since TIME] [--limit N] [--pace D] --dry-run|--yes [--account A]", example: "envctl dlq replay --tenant acme --project field --code http_5xx --since 2026-01-02T00:00:00Z --dry-run"},
		}},
		{name: "outbox", summary: "inspect outbox messages and their delivery attempts; move old outbound bodies", subs: []*command{
			{name: "show", summary: "print a message's status as one JSON object (as GET /v1/outbox/{id})", run: runOutboxShow,
				usage: "--tenant T --id M", example: "envctl outbox show --tenant acme --id msg_0123456789abcdef01234567"},
			{name: "attempts", summary: fmt.Sprintf("print a message's latest %d delivery attempts, oldest first, one JSON object a line", store.MaxAttemptHistory), run: runOutboxAttempts,
				usage: "--tenant T --id M", example: "envctl outbox attempts --tenant acme --id msg_0123456789abcdef01234567"},
			{name: "backfill-bodies", summary: "move bodies stored by releases before migration 0008 to outbound_bodies (run as the schema owner; resumable)", run: runOutboxBackfillBodies,
				usage: "[--batch N] [--pause D] [--retention D]", example: "envctl outbox backfill-bodies --retention 2160h --pause 100ms"},
		}},
		{name: "analyze", summary: "gather the statistics of the partitioned layout's parent tables, which autovacuum never does (run as the schema owner)", run: runAnalyze,
			usage: "[--database-url URL] [--timeout D]", example: "envctl analyze --timeout 30m"},
		{name: "verify", summary: "check the invariants a restored database must keep", run: runVerify,
			usage: "[--database-url URL] [--timeout D]", example: "envctl verify --database-url \"$RESTORED_DATABASE_URL\""},
	}
}

// Run executes one envctl command line (args without the program name) and returns the exit code.
func Run(ctx context.Context, args []string, env Env) int {
	c := &cli{Env: env}
	if c.Stdin == nil {
		c.Stdin = strings.NewReader("")
	}
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	if c.Getenv == nil {
		c.Getenv = func(string) string { return "" }
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c.dispatch(ctx, "envctl", commands(), args)
}

func (c *cli) dispatch(ctx context.Context, path string, cmds []*command, args []string) int {
	if len(args) == 0 {
		c.printGroup(c.Stderr, path, cmds)
		return ExitUsage
	}
	name := args[0]
	if isHelp(name) {
		c.printGroup(c.Stdout, path, cmds)
		return ExitOK
	}
	for _, cmd := range cmds {
		if cmd.name != name {
			continue
		}
		sub := path + " " + name
		if cmd.subs != nil && (cmd.run == nil || (len(args) > 1 && hasCommand(cmd.subs, args[1]))) {
			return c.dispatch(ctx, sub, cmd.subs, args[1:])
		}
		c.usage, c.example = cmd.usage, cmd.example
		return cmd.run(ctx, c, sub, args[1:])
	}
	fmt.Fprintf(c.Stderr, "%s: unknown command %q\nRun '%s -h' for the list of commands.\n", path, name, path)
	return ExitUsage
}

func hasCommand(cmds []*command, name string) bool {
	for _, c := range cmds {
		if c.name == name {
			return true
		}
	}
	return false
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

func (c *cli) printGroup(w io.Writer, path string, cmds []*command) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", path)
	for _, cmd := range cmds {
		fmt.Fprintf(w, "  %-12s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintf(w, "\nRun '%s <command> -h' for the flags of a command.\n", path)
}

// flagSet builds the FlagSet of the leaf command being run; -h shows its usage, flags and example.
func (c *cli) flagSet(path string) *flag.FlagSet {
	fs := flag.NewFlagSet(path, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // parse errors are reported by parse, once, on stderr
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s %s\n\nFlags:\n", path, c.usage)
		fs.PrintDefaults()
		c.printExample(fs.Output())
	}
	return fs
}

func (c *cli) printExample(w io.Writer) {
	if c.example != "" {
		fmt.Fprintf(w, "\nExample:\n  %s\n", c.example)
	}
}

// parse parses flags; when it returns done, the command must return code (help printed or usage error).
func (c *cli) parse(fs *flag.FlagSet, path string, args []string) (done bool, code int) {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(c.Stdout)
		fs.Usage()
		return true, ExitOK
	}
	if err != nil {
		return true, c.usageError(path, "%v", err)
	}
	if fs.NArg() > 0 {
		return true, c.usageError(path, "unexpected argument %q", fs.Arg(0))
	}
	return false, ExitOK
}

func (c *cli) usageError(path, format string, a ...any) int {
	fmt.Fprintf(c.Stderr, "%s: %s\nRun '%s -h' for usage.\n", path, fmt.Sprintf(format, a...), path)
	return ExitUsage
}

func (c *cli) failure(path, format string, a ...any) int {
	fmt.Fprintf(c.Stderr, "%s: %s\n", path, fmt.Sprintf(format, a...))
	return ExitFailure
}

// requireFlags reports the first of the named string flags that was left empty.
func requireFlags(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil || f.Value.String() == "" {
			return fmt.Errorf("--%s is required", n)
		}
	}
	return nil
}

// checkIdentities applies the contract's identity rule (tenant_id, project_id, producer_id, key_id)
// to required flags; envctl applies it to account and device ids too, since a device id becomes an
// envelope's producer_id.
func checkIdentities(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		v := fs.Lookup(n).Value.String()
		if v == "" {
			return fmt.Errorf("--%s is required", n)
		}
		if !envelope.ValidIdentity(v) {
			return fmt.Errorf("--%s %q is not a valid identity (1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit)", n, v)
		}
	}
	return nil
}

// objectFlags are the flags of a command on one object of a tenant: --tenant T --id X and the
// database flags. A command may add its own to fs before parse.
type objectFlags struct {
	fs   *flag.FlagSet
	db   *dbFlags
	id   *string
	kind string // what the id names, for the refusal of one too long: "an endpoint id"
	max  int
}

func (c *cli) objectFlags(path, kind, idHelp string, max int) *objectFlags {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	return &objectFlags{fs: fs, id: fs.String("id", "", idHelp+" (required)"), db: c.addDBFlags(fs, time.Minute), kind: kind, max: max}
}

// parse parses args and checks --tenant and --id; done reports an answer already given (-h or a
// usage error) with its exit code.
func (o *objectFlags) parse(c *cli, path string, args []string) (tenant, id string, done bool, code int) {
	if done, code := c.parse(o.fs, path, args); done {
		return "", "", true, code
	}
	if err := checkIdentities(o.fs, "tenant"); err != nil {
		return "", "", true, c.usageError(path, "%v", err)
	}
	if *o.id == "" {
		return "", "", true, c.usageError(path, "--id is required")
	}
	if len(*o.id) > o.max {
		return "", "", true, c.usageError(path, "--id is longer than %d bytes: not %s", o.max, o.kind)
	}
	return o.fs.Lookup("tenant").Value.String(), *o.id, false, ExitOK
}

// run parses args, opens the store and calls fn on the object --tenant/--id name. A store.ErrNotFound
// from fn is "no NOUN ID in tenant T", any other error the store's failure; otherwise fn's code.
func (o *objectFlags) run(ctx context.Context, c *cli, path string, args []string, noun string,
	fn func(ctx context.Context, s *store.Store, tenant, id string) (int, error)) int {
	tenant, id, done, code := o.parse(c, path, args)
	if done {
		return code
	}
	s, cctx, cancel, code := c.open(ctx, path, o.db)
	if s == nil {
		return code
	}
	defer cancel()
	code, err := fn(cctx, s, tenant, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return c.failure(path, "no %s %q in tenant %s", noun, id, tenant)
	case err != nil:
		return c.storeFailure(path, err)
	}
	return code
}

// dbFlags are shared by every database command.
type dbFlags struct {
	url     string
	timeout time.Duration
}

func (c *cli) addDBFlags(fs *flag.FlagSet, defTimeout time.Duration) *dbFlags {
	d := &dbFlags{}
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	fs.DurationVar(&d.timeout, "timeout", defTimeout, "give up after this long")
	return d
}

// dsn resolves --database-url or DATABASE_URL; "" means the usage error was reported and code is set.
func (c *cli) dsn(path string, d *dbFlags) (string, int) {
	dsn := d.url
	if dsn == "" {
		dsn = c.Getenv("DATABASE_URL")
	}
	if dsn == "" {
		return "", c.usageError(path, "DATABASE_URL is not set (or pass --database-url)")
	}
	if d.timeout <= 0 {
		return "", c.usageError(path, "--timeout must be positive")
	}
	// Checked here, not left to the driver: its parse errors quote the DSN
	// with the query, where a password= or sslpassword= is not masked.
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return "", c.usageError(path, "DATABASE_URL (or --database-url) is not a valid PostgreSQL connection string")
	}
	return dsn, ExitOK
}

// parseDSN parses fs and resolves the database URL, for the commands that open the database themselves
// (migrate, migrate status, verify): "" means the command must return code; otherwise cctx carries the
// command's --timeout and cancel releases it.
func (c *cli) parseDSN(ctx context.Context, fs *flag.FlagSet, path string, args []string, d *dbFlags) (dsn string, cctx context.Context, cancel func(), code int) {
	if done, code := c.parse(fs, path, args); done {
		return "", nil, nil, code
	}
	if dsn, code = c.dsn(path, d); dsn == "" {
		return "", nil, nil, code
	}
	cctx, cancel = context.WithTimeout(ctx, d.timeout)
	return dsn, cctx, cancel, ExitOK
}

// open connects to the database named by --database-url or DATABASE_URL. The returned context carries
// the command's timeout; cancel releases it and the store.
func (c *cli) open(ctx context.Context, path string, d *dbFlags) (s *store.Store, cctx context.Context, cancel func(), code int) {
	dsn, code := c.dsn(path, d)
	if dsn == "" {
		return nil, nil, nil, code
	}
	cctx, cancelCtx := context.WithTimeout(ctx, d.timeout)
	s, err := store.Open(cctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		cancelCtx()
		return nil, nil, nil, c.failure(path, "cannot open the database: %v", err)
	}
	return s, cctx, func() { s.Close(); cancelCtx() }, ExitOK
}

// storeFailure maps an unexpected store error to exit 1 with a message that names the kind of failure;
// the store's own messages carry no SQL or driver text.
func (c *cli) storeFailure(path string, err error) int {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return c.failure(path, "timed out (see --timeout): %v", err)
	case errors.Is(err, store.ErrUnavailable):
		return c.failure(path, "database unavailable: %v", err)
	default:
		return c.failure(path, "%v", err)
	}
}
