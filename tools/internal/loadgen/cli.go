package loadgen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// Exit codes of Main: as envctl's.
const (
	ExitOK      = 0
	ExitFailure = 1 // the run had refusals or transport errors, or setup failed
	ExitUsage   = 2
)

// Env is what Main needs from the process.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

const usage = `Usage:
  loadgen-ingest setup --out CREDS.json [--producers N] [--tenant T] [--account A] [--prefix P] [--database-url URL]
                       [--outbox --project P --topic T]
  loadgen-ingest run --creds CREDS.json [--url http://127.0.0.1:8080] [--producers C] [--count N]
                     [--duration D] [--rate R] [--batch B] [--payload-bytes N] [--same-credential] [--json]

setup issues a device credential and registers a key per producer (DATABASE_URL);
run signs every envelope first, then drives ingest-api (loopback only) and reports
throughput and p50/p99/p99.9 latency. With --outbox, setup issues service
credentials and adds one endpoint of (project, topic); run then drives
POST /v1/outbox (or /v1/outbox/batch with --batch), and --same-credential sends
every concurrent client's requests with the first credential (one outbound
stream: one busy producer). Run 'loadgen-ingest <command> -h' for the flags.
`

// Main runs one loadgen-ingest command line and returns the exit code.
func Main(ctx context.Context, args []string, env Env) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if len(args) == 0 {
		fmt.Fprint(env.Stderr, usage)
		return ExitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(env.Stdout, usage)
		return ExitOK
	case "setup":
		return mainSetup(ctx, args[1:], env)
	case "run":
		return mainRun(ctx, args[1:], env)
	}
	fmt.Fprintf(env.Stderr, "loadgen-ingest: unknown command %q\n%s", args[0], usage)
	return ExitUsage
}

func parseFlags(fs *flag.FlagSet, args []string, env Env) (done bool, code int) {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(env.Stdout)
		fmt.Fprintf(env.Stdout, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		return true, ExitOK
	case err != nil:
		return true, usageErr(env, fs.Name(), "%v", err)
	case fs.NArg() > 0:
		return true, usageErr(env, fs.Name(), "unexpected argument %q", fs.Arg(0))
	}
	return false, ExitOK
}

func usageErr(env Env, name, format string, a ...any) int {
	fmt.Fprintf(env.Stderr, "%s: %s\nRun '%s -h' for usage.\n", name, fmt.Sprintf(format, a...), name)
	return ExitUsage
}

func mainSetup(ctx context.Context, args []string, env Env) int {
	name := "loadgen-ingest setup"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	out := fs.String("out", "", "credentials file to create (mode 0600, never overwritten) (required)")
	n := fs.Int("producers", 64, "how many producers (device credential + key each)")
	tenant := fs.String("tenant", "loadgen", "tenant id")
	account := fs.String("account", "loadgen", "account id of every producer")
	prefix := fs.String("prefix", "", "device and key id prefix (default lg-<random hex>, so setup can run again on one database)")
	dsnFlag := fs.String("database-url", "", "PostgreSQL connection URL (default $DATABASE_URL)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	outbox := fs.Bool("outbox", false, "service credentials and an endpoint of --project/--topic, for the outbox routes")
	project := fs.String("project", "loadgen", "project of the outbox endpoint (with --outbox)")
	topic := fs.String("topic", "loadgen.outbox", "topic of the outbox endpoint (with --outbox)")
	if done, code := parseFlags(fs, args, env); done {
		return code
	}
	if *outbox && !identityRE.MatchString(*project) {
		return usageErr(env, name, "--project %q is not a valid identity", *project)
	}
	if *out == "" {
		return usageErr(env, name, "--out is required")
	}
	// Checked up front so a taken path does not leave producers in the database that nobody can use.
	if _, err := os.Lstat(*out); err == nil {
		return usageErr(env, name, "%s exists; setup never overwrites a credentials file", *out)
	}
	if *n < 1 || *n > MaxProducers {
		return usageErr(env, name, "--producers must be 1-%d", MaxProducers)
	}
	if *prefix == "" {
		var b [3]byte
		if _, err := rand.Read(b[:]); err != nil {
			fmt.Fprintf(env.Stderr, "%s: %v\n", name, err)
			return ExitFailure
		}
		*prefix = "lg-" + hex.EncodeToString(b[:])
	}
	for _, v := range []struct{ flag, val string }{{"tenant", *tenant}, {"account", *account}, {"prefix", *prefix + "-0000"}} {
		if !identityRE.MatchString(v.val) {
			return usageErr(env, name, "--%s %q makes invalid identities", v.flag, v.val)
		}
	}
	dsn := *dsnFlag
	if dsn == "" {
		dsn = env.Getenv("DATABASE_URL")
	}
	if dsn == "" {
		return usageErr(env, name, "DATABASE_URL is not set (or pass --database-url)")
	}
	if *timeout <= 0 {
		return usageErr(env, name, "--timeout must be positive")
	}
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	s, err := store.Open(cctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		fmt.Fprintf(env.Stderr, "%s: cannot open the database: %v\n", name, err)
		return ExitFailure
	}
	defer s.Close()
	creds, err := Setup(cctx, s, SetupConfig{Tenant: *tenant, Account: *account, Prefix: *prefix, Producers: *n,
		Outbox: *outbox, Project: *project, Topic: *topic})
	if err != nil {
		fmt.Fprintf(env.Stderr, "%s: %v\n", name, err)
		return ExitFailure
	}
	if err := WriteCreds(*out, creds); err != nil {
		fmt.Fprintf(env.Stderr, "%s: %v\n", name, err)
		return ExitFailure
	}
	fmt.Fprintf(env.Stdout, "set up %d producers in tenant %s (%s-0001 …); credentials in %s\n", *n, *tenant, *prefix, *out)
	return ExitOK
}

func mainRun(ctx context.Context, args []string, env Env) int {
	name := "loadgen-ingest run"
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	rawURL := fs.String("url", "http://127.0.0.1:8080", "ingest-api base URL (loopback only)")
	credsFile := fs.String("creds", "", "credentials file from setup (required)")
	producers := fs.Int("producers", 1, "concurrent producers, one stream and one request in flight each")
	count := fs.Int("count", 10000, "envelopes in all, signed before the clock starts")
	duration := fs.Duration("duration", 0, "stop issuing after this long (0: until count is sent)")
	rate := fs.Float64("rate", 0, "total target rate in envelopes/s (0: flat out)")
	batch := fs.Int("batch", 0, "envelopes per request on the batch route (0: single route)")
	payload := fs.Int("payload-bytes", 256, "padding bytes in each payload")
	project := fs.String("project", "", "project id of the streams (default lg-<random hex>: fresh streams)")
	timeout := fs.Duration("timeout", 30*time.Second, "per request")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	same := fs.Bool("same-credential", false, "every client sends with the first credential (outbox files only: one busy producer)")
	viaSDK := fs.Bool("sdk", false, "send through the producer module (in-memory store), signing and numbering inside the clock (device files only)")
	if done, code := parseFlags(fs, args, env); done {
		return code
	}
	u, err := access.CheckURL(*rawURL, true)
	if err != nil {
		return usageErr(env, name, "%v", err)
	}
	if *credsFile == "" {
		return usageErr(env, name, "--creds is required")
	}
	if *project != "" && !identityRE.MatchString(*project) {
		return usageErr(env, name, "--project %q is not a valid identity", *project)
	}
	creds, err := ReadCreds(*credsFile)
	if err != nil {
		return usageErr(env, name, "%v", err)
	}
	plan, err := NewPlan(Config{
		URL: u, Creds: creds, Producers: *producers, Count: *count, Duration: *duration, Rate: *rate,
		Batch: *batch, PayloadBytes: *payload, Project: *project, Timeout: *timeout, SameCredential: *same,
		SDK: *viaSDK,
	})
	if err != nil {
		return usageErr(env, name, "%v", err)
	}
	rep, err := plan.Run(ctx)
	if *asJSON {
		b, _ := json.Marshal(rep)
		fmt.Fprintf(env.Stdout, "%s\n", b)
	} else {
		fmt.Fprint(env.Stdout, rep.String())
	}
	if err != nil {
		fmt.Fprintf(env.Stderr, "%s: %v\n", name, err)
		return ExitFailure
	}
	if !rep.OK() {
		fmt.Fprintf(env.Stderr, "%s: not every envelope was accepted (see the report)\n", name)
		return ExitFailure
	}
	return ExitOK
}
