package envctl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// maxObjectID bounds endpoint and message ids on the command line; the store issues "ep_"/"msg_" plus
// 24 hex digits, so anything longer is a paste error, not an id.
const maxObjectID = 64

func runEndpointAdd(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	fs.String("project", "", "project id (required)")
	topic := fs.String("topic", "", fmt.Sprintf("topic the endpoint subscribes to, e.g. task.proposals; at most %d active endpoints a topic (required)", store.MaxTopicEndpoints))
	rawURL := fs.String("url", "", "https URL; http only for loopback hosts (127.0.0.0/8, [::1], localhost) (required)")
	secretRef := fs.String("secret-ref", "", "name of the endpoint's secrets in the worker's WEBHOOK_SECRETS_FILE; never the secret itself (required)")
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "project"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if err := requireFlags(fs, "topic", "url", "secret-ref"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if !store.ValidTopic(*topic) {
		return c.usageError(path, "--topic %q is not a valid topic (1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit)", *topic)
	}
	if err := checkEndpointURL(*rawURL); err != nil {
		return c.usageError(path, "%v", err)
	}
	if err := checkSecretRef(*secretRef); err != nil {
		return c.usageError(path, "%v", err)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	tenant, project := fs.Lookup("tenant").Value.String(), fs.Lookup("project").Value.String()
	id, err := s.Outbox().AddEndpoint(cctx, store.Endpoint{TenantID: tenant, ProjectID: project, Topic: *topic, URL: *rawURL, SecretRef: *secretRef})
	if err != nil {
		switch {
		case errors.Is(err, store.ErrInvalid):
			return c.failure(path, "refused: %v", err)
		case errors.Is(err, store.ErrTopicFull):
			return c.failure(path, "%s", topicFullMessage(tenant, project, *topic))
		case errors.Is(err, store.ErrSecretRefForeign):
			return c.failure(path, "%s", secretRefForeignMessage(*secretRef, tenant))
		}
		return c.storeFailure(path, err)
	}
	fmt.Fprintln(c.Stdout, id)
	fmt.Fprintf(c.Stderr, "added endpoint %s (tenant %s, project %s, topic %s, secret ref %s); active\n", id, tenant, project, *topic, *secretRef)
	return ExitOK
}

func runEndpointEnable(ctx context.Context, c *cli, path string, args []string) int {
	return endpointTransition(ctx, c, path, args, store.EndpointActive)
}

func runEndpointDisable(ctx context.Context, c *cli, path string, args []string) int {
	return endpointTransition(ctx, c, path, args, store.EndpointDisabled)
}

// disabledByOperator is the disabled_reason of `endpoint disable`, next to the worker's http_410.
const disabledByOperator = "operator"

// endpointFlags are --tenant T --id E of the endpoint commands.
func endpointFlags(c *cli, path string) *objectFlags {
	return c.objectFlags(path, "an endpoint id", "endpoint id, as printed by endpoint add", maxObjectID)
}

func endpointTransition(ctx context.Context, c *cli, path string, args []string, state store.EndpointState) int {
	return endpointFlags(c, path).run(ctx, c, path, args, "endpoint", func(ctx context.Context, s *store.Store, tenant, id string) (int, error) {
		reason := ""
		if state == store.EndpointDisabled {
			reason = disabledByOperator
		}
		// Disabling an endpoint the worker already disabled (http_410) relabels the reason as the
		// operator's: from then on it is the operator's decision that keeps it off.
		if err := s.Outbox().SetEndpointState(ctx, tenant, id, state, reason); err != nil {
			if !errors.Is(err, store.ErrTopicFull) {
				return 0, err
			}
			// The refusal names the topic; a lookup failure here only loses that detail.
			if e, gerr := s.Outbox().GetEndpoint(ctx, tenant, id); gerr == nil {
				return c.failure(path, "%s", topicFullMessage(tenant, e.ProjectID, e.Topic)), nil
			}
			return c.failure(path, "refused: %v; disable another endpoint of its topic first", err), nil
		}
		fmt.Fprintf(c.Stdout, "endpoint %s in tenant %s is %s\n", id, tenant, state)
		return ExitOK, nil
	})
}

// topicFullMessage is the refusal of `endpoint add` and `endpoint enable` for a topic at the fan-out
// bound; it says what to do, since the bound itself does not move.
func topicFullMessage(tenant, project, topic string) string {
	return fmt.Sprintf("refused: topic %s of tenant %s, project %s has %d active endpoints, the most allowed "+
		"(one enqueue writes one message per active endpoint; contract §8.12); disable one first (endpoint disable)",
		topic, tenant, project, store.MaxTopicEndpoints)
}

// endpointLine is the output of `endpoint show` and `endpoint update` and a line of `endpoint list`. No secret is stored, so none can be shown.
type endpointLine struct {
	EndpointID     string  `json:"endpoint_id"`
	TenantID       string  `json:"tenant_id"`
	ProjectID      string  `json:"project_id"`
	Topic          string  `json:"topic"`
	URL            string  `json:"url"`
	SecretRef      string  `json:"secret_ref"`
	State          string  `json:"state"`
	DisabledReason *string `json:"disabled_reason"`
	CreatedAt      string  `json:"created_at"`
}

func runEndpointShow(ctx context.Context, c *cli, path string, args []string) int {
	return endpointFlags(c, path).run(ctx, c, path, args, "endpoint", func(ctx context.Context, s *store.Store, tenant, id string) (int, error) {
		e, err := s.Outbox().GetEndpoint(ctx, tenant, id)
		if err != nil {
			return 0, err
		}
		return c.printJSON(path, newEndpointLine(e)), nil
	})
}

func newEndpointLine(e store.Endpoint) endpointLine {
	return endpointLine{
		EndpointID: e.ID, TenantID: e.TenantID, ProjectID: e.ProjectID, Topic: e.Topic, URL: e.URL,
		SecretRef: e.SecretRef, State: string(e.State), DisabledReason: orNull(e.DisabledReason),
		CreatedAt: formatTime(e.CreatedAt),
	}
}

func (c *cli) printJSON(path string, v any) int {
	if err := json.NewEncoder(c.Stdout).Encode(v); err != nil {
		return c.failure(path, "write: %v", err)
	}
	return ExitOK
}

func formatTime(t time.Time) string { return wire.FormatTime(t) }

func formatTimePtr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := formatTime(*t)
	return &s
}

func runDLQList(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	fs.String("project", "", "project id (required)")
	limit := fs.Int("limit", store.MaxDeadLetterPage, fmt.Sprintf("at most this many dead letters, oldest death first (1-%d)", store.MaxDeadLetterPage))
	after := fs.String("after", "", "continue after this cursor (the next_after a previous page printed on stderr)")
	d := c.addDBFlags(fs, time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant", "project"); err != nil {
		return c.usageError(path, "%v", err)
	}
	if *limit < 1 || *limit > store.MaxDeadLetterPage {
		return c.usageError(path, "--limit %d is outside 1-%d", *limit, store.MaxDeadLetterPage)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	dls, next, err := s.Outbox().ListDeadLetters(cctx, fs.Lookup("tenant").Value.String(), fs.Lookup("project").Value.String(), *limit, *after)
	if err != nil {
		// Tenant, project and limit were checked above, so the store can only mean the cursor.
		if errors.Is(err, store.ErrInvalid) {
			return c.usageError(path, "--after is not a cursor printed by dlq list")
		}
		return c.storeFailure(path, err)
	}
	enc := json.NewEncoder(c.Stdout)
	for _, dl := range dls {
		// One line is an entry of GET /v1/dead-letters (contract §4).
		line := wire.DeadLetter{
			MessageID: dl.MessageID, EndpointID: dl.EndpointID, Topic: dl.Topic, Attempts: dl.Attempts,
			ErrorCode: dl.ErrorCode, CreatedAt: formatTime(dl.CreatedAt), DeadAt: formatTime(dl.DeadAt),
		}
		if err := enc.Encode(line); err != nil {
			return c.failure(path, "write: %v", err)
		}
	}
	// stdout stays one object per dead letter; the page cursor is commentary a pager script reads
	// from stderr.
	if next != nil {
		fmt.Fprintf(c.Stderr, "next_after %s\n", *next)
	}
	return ExitOK
}

// newStatusLine is the output of `dlq replay`: the status object of GET /v1/outbox/{id} (contract §4).
func newStatusLine(m store.MessageStatus) wire.MessageStatus {
	return wire.MessageStatus{
		MessageID: m.MessageID, EndpointID: m.EndpointID, Topic: m.Topic, Status: wire.MessageState(m.Status),
		Attempts: m.Attempts, LastErrorCode: orNull(m.LastErrorCode),
		NextAttemptAt: formatTimePtr(m.NextAttemptAt), DeliveredAt: formatTimePtr(m.DeliveredAt),
		PayloadExpired: m.PayloadExpired,
	}
}

// newCorrelationID makes the audit correlation id of one envctl action; the "envctl-" prefix tells
// operator actions from ingest-api requests in the audit stream.
func newCorrelationID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "envctl-" + hex.EncodeToString(b[:])
}

// maxBulkReplay bounds one bulk replay: a larger backlog is replayed in several runs, each reviewed with
// --dry-run first.
const maxBulkReplay = 10000

// dlqReplayFlags are the flags of `dlq replay`: --id replays one dead letter, the rest select a bulk.
type dlqReplayFlags struct {
	id, project, endpoint, code, since string
	limit                              int
	dryRun, yes                        bool
	pace                               time.Duration
}

func runDLQReplay(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	fs.String("tenant", "", "tenant id (required)")
	var f dlqReplayFlags
	fs.StringVar(&f.id, "id", "", "message id of one dead letter, as dlq list prints it")
	fs.String("account", "", "who replays: recorded as account_id in each audit row (optional)")
	fs.StringVar(&f.project, "project", "", "bulk: replay this project's dead letters (required without --id)")
	fs.StringVar(&f.endpoint, "endpoint", "", "bulk: only dead letters of this endpoint id")
	fs.StringVar(&f.code, "code", "", "bulk: only dead letters whose last error code is this, e.g. http_5xx")
	fs.StringVar(&f.since, "since", "", "bulk: only dead letters that died at or after this time (RFC 3339)")
	fs.IntVar(&f.limit, "limit", 100, fmt.Sprintf("bulk: replay at most this many, oldest death first (1-%d)", maxBulkReplay))
	fs.BoolVar(&f.dryRun, "dry-run", false, "bulk: print the dead letters that would be replayed and replay none")
	fs.BoolVar(&f.yes, "yes", false, "bulk: replay them (a bulk replay is refused without --dry-run or --yes)")
	fs.DurationVar(&f.pace, "pace", 50*time.Millisecond, "bulk: wait this long between two replays, so a backlog does not reach the endpoint all at once")
	d := c.addDBFlags(fs, 10*time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if err := checkIdentities(fs, "tenant"); err != nil {
		return c.usageError(path, "%v", err)
	}
	account := fs.Lookup("account").Value.String()
	if account != "" {
		if err := checkIdentities(fs, "account"); err != nil {
			return c.usageError(path, "%v", err)
		}
	}
	tenant := fs.Lookup("tenant").Value.String()
	actor := store.Actor{TenantID: tenant, AccountID: account, CorrelationID: newCorrelationID()}
	if f.id != "" {
		for _, n := range []string{"project", "endpoint", "code", "since", "limit", "dry-run", "yes", "pace"} {
			if flagSet(fs, n) {
				return c.usageError(path, "--%s selects a bulk replay; it cannot be given with --id", n)
			}
		}
		if len(f.id) > maxObjectID {
			return c.usageError(path, "--id is longer than %d bytes: not a message id", maxObjectID)
		}
		if !flagSet(fs, "timeout") {
			d.timeout = time.Minute // the bulk default is for paced runs; one replay needs a moment
		}
		s, cctx, cancel, code := c.open(ctx, path, d)
		if s == nil {
			return code
		}
		defer cancel()
		return c.replayOne(cctx, s, path, actor, f.id)
	}
	sel, err := f.selection(fs)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	return c.replayBulk(cctx, s, path, actor, sel, f)
}

// bulkSelection is what a bulk replay matches, checked.
type bulkSelection struct {
	project, endpoint, code string
	since                   time.Time
}

func (sel bulkSelection) matches(dl store.DeadLetter) bool {
	return (sel.endpoint == "" || dl.EndpointID == sel.endpoint) && (sel.code == "" || dl.ErrorCode == sel.code) &&
		!dl.DeadAt.Before(sel.since)
}

func (f dlqReplayFlags) selection(fs *flag.FlagSet) (bulkSelection, error) {
	if f.project == "" {
		return bulkSelection{}, errors.New("--id is required for one dead letter; for a bulk replay give --project (and filters) with --dry-run or --yes")
	}
	if err := checkIdentities(fs, "project"); err != nil {
		return bulkSelection{}, err
	}
	if f.dryRun == f.yes {
		return bulkSelection{}, errors.New("a bulk replay needs exactly one of --dry-run (show what would be replayed) or --yes (replay it)")
	}
	if len(f.endpoint) > maxObjectID {
		return bulkSelection{}, fmt.Errorf("--endpoint is longer than %d bytes: not an endpoint id", maxObjectID)
	}
	if f.code != "" && !store.ValidErrorCode(f.code) {
		return bulkSelection{}, fmt.Errorf("--code %q is not a delivery error code (one of %s)", f.code, strings.Join(store.ErrorCodes(), ", "))
	}
	if f.limit < 1 || f.limit > maxBulkReplay {
		return bulkSelection{}, fmt.Errorf("--limit %d is outside 1-%d", f.limit, maxBulkReplay)
	}
	if f.pace < 0 {
		return bulkSelection{}, errors.New("--pace must not be negative")
	}
	since, err := parseTimeFlag("since", f.since)
	if err != nil {
		return bulkSelection{}, err
	}
	return bulkSelection{project: f.project, endpoint: f.endpoint, code: f.code, since: since}, nil
}

func (c *cli) replayOne(ctx context.Context, s *store.Store, path string, actor store.Actor, id string) int {
	m, err := s.Outbox().ReplayDeadLetter(ctx, actor, id)
	if err != nil {
		return c.replayRefusal(ctx, s, path, actor.TenantID, id, err)
	}
	if code := c.printJSON(path, newStatusLine(m)); code != ExitOK {
		return code
	}
	fmt.Fprintf(c.Stderr, "replayed message %s; audit correlation id %s\n", m.MessageID, actor.CorrelationID)
	return ExitOK
}

// replayRefusal reports why the replay of id did not happen, exit 1.
func (c *cli) replayRefusal(ctx context.Context, s *store.Store, path, tenant, id string, err error) int {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return c.failure(path, "no message %q in tenant %s", id, tenant)
	case errors.Is(err, store.ErrNotDead):
		// Name the status so the operator knows whether to wait (pending, delivering) or stop
		// (delivered); a lookup failure here only loses that detail.
		if st, err := s.Outbox().OutboxMessage(ctx, tenant, id); err == nil {
			return c.failure(path, "refused: message %s is not dead (status %s); only dead letters can be replayed", id, st.Status)
		}
		return c.failure(path, "refused: message %s is not dead; only dead letters can be replayed", id)
	case errors.Is(err, store.ErrPayloadExpired):
		return c.failure(path, "refused: the envelope body of message %s has expired (OUTBOX_PAYLOAD_RETENTION) and was deleted; there is nothing to send", id)
	}
	return c.storeFailure(path, err)
}

// replayBulk walks the project's dead letters oldest death first and replays (or, dry, prints) those
// that match, one store.ReplayDeadLetter each, so each writes its own audit row as a single replay
// does; the run's rows share one correlation id. A message replayed here that dies again during the
// run comes back later in the walk with a new dead_at; seen keeps it from being replayed twice.
func (c *cli) replayBulk(ctx context.Context, s *store.Store, path string, actor store.Actor, sel bulkSelection, f dlqReplayFlags) int {
	enc := json.NewEncoder(c.Stdout)
	seen := map[string]bool{}
	var replayed, skipped, failed int
	after := ""
	if !sel.since.IsZero() {
		// Start at the first death at or after --since rather than reading every older page.
		after = store.DeadLetterCursorAt(sel.since)
	}
walk:
	for {
		dls, next, err := s.Outbox().ListDeadLetters(ctx, actor.TenantID, sel.project, store.MaxDeadLetterPage, after)
		if err != nil {
			return c.storeFailure(path, err)
		}
		for _, dl := range dls {
			if !sel.matches(dl) || seen[dl.MessageID] {
				continue
			}
			seen[dl.MessageID] = true
			if f.dryRun {
				line := wire.DeadLetter{MessageID: dl.MessageID, EndpointID: dl.EndpointID, Topic: dl.Topic, Attempts: dl.Attempts,
					ErrorCode: dl.ErrorCode, CreatedAt: formatTime(dl.CreatedAt), DeadAt: formatTime(dl.DeadAt)}
				if err := enc.Encode(line); err != nil {
					return c.failure(path, "write: %v", err)
				}
			} else {
				if replayed+skipped+failed > 0 && f.pace > 0 {
					t := time.NewTimer(f.pace)
					select {
					case <-ctx.Done():
						t.Stop()
						fmt.Fprintf(c.Stderr, "stopped after %d replayed; audit correlation id %s\n", replayed, actor.CorrelationID)
						return c.storeFailure(path, ctx.Err())
					case <-t.C:
					}
				}
				m, err := s.Outbox().ReplayDeadLetter(ctx, actor, dl.MessageID)
				switch {
				case err == nil:
					replayed++
					if err := enc.Encode(newStatusLine(m)); err != nil {
						return c.failure(path, "write: %v", err)
					}
				case errors.Is(err, store.ErrNotDead), errors.Is(err, store.ErrNotFound):
					// Replayed or removed by someone else since the page was read.
					skipped++
					fmt.Fprintf(c.Stderr, "skipped message %s: no longer a dead letter\n", dl.MessageID)
				case errors.Is(err, store.ErrPayloadExpired):
					// Nothing to send (§8.9); running again would not change that.
					skipped++
					fmt.Fprintf(c.Stderr, "skipped message %s: its envelope body expired (OUTBOX_PAYLOAD_RETENTION)\n", dl.MessageID)
				case errors.Is(err, store.ErrUnavailable), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
					fmt.Fprintf(c.Stderr, "stopped after %d replayed; audit correlation id %s\n", replayed, actor.CorrelationID)
					return c.storeFailure(path, err)
				default:
					failed++
					fmt.Fprintf(c.Stderr, "message %s not replayed: %v\n", dl.MessageID, err)
				}
			}
			if len(seen) == f.limit {
				break walk
			}
		}
		if next == nil {
			break
		}
		after = *next
	}
	if f.dryRun {
		fmt.Fprintf(c.Stderr, "dry run: %d dead letter(s) would be replayed; nothing was changed (run again with --yes)\n", len(seen))
		return ExitOK
	}
	fmt.Fprintf(c.Stderr, "replayed %d, skipped %d, failed %d; audit correlation id %s\n", replayed, skipped, failed, actor.CorrelationID)
	if failed > 0 {
		return ExitFailure
	}
	return ExitOK
}

// messageFlags are --tenant T --id M of the outbox commands.
func messageFlags(c *cli, path string) *objectFlags {
	return c.objectFlags(path, "a message id", "message id, as POST /v1/outbox answered it or dlq list prints it", maxObjectID)
}

func runOutboxShow(ctx context.Context, c *cli, path string, args []string) int {
	return messageFlags(c, path).run(ctx, c, path, args, "message", func(ctx context.Context, s *store.Store, tenant, id string) (int, error) {
		m, err := s.Outbox().OutboxMessage(ctx, tenant, id)
		if err != nil {
			return 0, err
		}
		return c.printJSON(path, newStatusLine(m)), nil
	})
}

func runOutboxAttempts(ctx context.Context, c *cli, path string, args []string) int {
	return messageFlags(c, path).run(ctx, c, path, args, "message", func(ctx context.Context, s *store.Store, tenant, id string) (int, error) {
		as, err := s.Outbox().OutboxAttempts(ctx, tenant, id)
		if err != nil {
			return 0, err
		}
		enc := json.NewEncoder(c.Stdout)
		for _, a := range as {
			// One line is an entry of GET /v1/outbox/{id}/attempts (contract §8.8).
			line := wire.Attempt{Attempt: a.Attempt, StartedAt: formatTime(a.StartedAt), DurationMS: a.Duration.Milliseconds(),
				ErrorCode: orNull(a.ErrorCode), Result: wire.AttemptResult(a.Result)}
			if a.HTTPStatus != 0 {
				status := a.HTTPStatus
				line.HTTPStatus = &status
			}
			if err := enc.Encode(line); err != nil {
				return c.failure(path, "write: %v", err), nil
			}
		}
		if len(as) == 0 {
			// stdout stays empty (no attempt, no line); say why on stderr.
			fmt.Fprintf(c.Stderr, "message %s has no recorded attempt yet\n", id)
		}
		return ExitOK, nil
	})
}

// runOutboxBackfillBodies moves the bodies releases before migration 0008
// stored in outbound_envelopes.envelope to outbound_bodies (the expand
// step's backfill; docs/operations.md, Rolling upgrades). It runs as the
// schema owner, like migrate: no service role may read and clear the old
// column. Batches are single short transactions, so it runs while
// deliveries continue and can be stopped and run again at any time.
func runOutboxBackfillBodies(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	batch := fs.Int("batch", store.MaxBackfillBatch, fmt.Sprintf("envelopes per transaction, 1-%d", store.MaxBackfillBatch))
	pause := fs.Duration("pause", 0, "wait between transactions (pacing on a busy database)")
	retention := fs.Duration("retention", store.DefaultOutboxPayloadRetention,
		"the delivery-workers' OUTBOX_PAYLOAD_RETENTION: a moved body expires this long after its last message settled")
	d := c.addDBFlags(fs, time.Hour)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	switch {
	case *batch < 1 || *batch > store.MaxBackfillBatch:
		return c.usageError(path, "--batch must be between 1 and %d", store.MaxBackfillBatch)
	case *pause < 0:
		return c.usageError(path, "--pause must not be negative")
	case *retention <= 0:
		return c.usageError(path, "--retention must be positive")
	}
	s, cctx, cancel, code := c.open(ctx, path, d)
	if s == nil {
		return code
	}
	defer cancel()
	var cur store.BackfillCursor
	var moved, left, steps int
	for {
		st, err := s.Retention().BackfillBodies(cctx, cur, *batch, *retention)
		if err != nil {
			fmt.Fprintf(c.Stderr, "stopped after %d transactions (%d bodies moved); running it again resumes\n", steps, moved)
			return c.storeFailure(path, err)
		}
		if st.Done {
			break
		}
		moved, left, steps, cur = moved+st.Moved, left+st.Left, steps+1, st.Next
		if *pause > 0 {
			select {
			case <-cctx.Done():
			case <-time.After(*pause):
			}
		}
	}
	// left counts bodies whose envelope still has a message pending or
	// delivering; they move on a later run, once it settled.
	return c.printJSON(path, struct {
		Moved        int `json:"moved"`
		LeftInFlight int `json:"left_in_flight"`
		Transactions int `json:"transactions"`
	}{moved, left, steps})
}
