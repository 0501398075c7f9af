package store

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// namedSQL is a hot statement written with pgx named arguments (@tenant,
// @sequence, ...) and rewritten to pgx's $n form once, when the package
// loads. pgx.NamedArgs rewrites the text on every call, a scan of the whole
// statement: tens of µs and 121 allocations for decideSQL, against about
// 2 µs and one allocation here (BenchmarkNamedArgsRewrite). bind takes a
// call's arguments by name, as pgx.StrictNamedArgs does, and only puts them
// in order.
type namedSQL struct {
	text  string   // as written, with @names
	sql   string   // as sent: $n numbered in order of first appearance
	names []string // names[i] is $(i+1)
}

// nameRE finds the candidate names; pgx's lexer, which skips string
// literals and comments, decides which of them are arguments.
var nameRE = regexp.MustCompile(`@[A-Za-z_][A-Za-z0-9_]*`)

func newNamedSQL(text string) *namedSQL {
	// Each name is given itself as its value, so the arguments pgx returns
	// spell out which name became which $n.
	na := pgx.NamedArgs{}
	for _, m := range nameRE.FindAllString(text, -1) {
		na[m[1:]] = m[1:]
	}
	sql, args, err := na.RewriteQuery(context.Background(), nil, text, nil)
	if err != nil {
		panic(fmt.Sprintf("store: named statement: %v", err))
	}
	q := &namedSQL{text: text, sql: sql, names: make([]string, len(args))}
	for i, a := range args {
		name, ok := a.(string)
		if !ok {
			panic("store: named statement: a name pgx found is not a plain @name")
		}
		q.names[i] = name
	}
	return q
}

// errNamedArgs: a call gave other names than its statement uses, or paired
// the arguments with another statement's text. A bug, never a value: the
// message names nothing.
var errNamedArgs = errors.New("named arguments do not match the statement")

// bind is a call's arguments as a pgx.QueryRewriter, passed first after the
// statement's text (q.text) to any pgx or database/sql (pgx stdlib) query
// method: every name the statement uses and no other, as
// pgx.StrictNamedArgs requires.
func (q *namedSQL) bind(args pgx.StrictNamedArgs) pgx.QueryRewriter { return boundSQL{q, args} }

type boundSQL struct {
	q    *namedSQL
	args pgx.StrictNamedArgs
}

func (b boundSQL) RewriteQuery(_ context.Context, _ *pgx.Conn, sql string, rest []any) (string, []any, error) {
	if sql != b.q.text || len(rest) != 0 || len(b.args) != len(b.q.names) {
		return "", nil, errNamedArgs
	}
	out := make([]any, len(b.q.names))
	for i, n := range b.q.names {
		v, ok := b.args[n]
		if !ok {
			return "", nil, errNamedArgs
		}
		out[i] = v
	}
	return b.q.sql, out, nil
}

// The hot statements, rewritten once.
var (
	lockStreamStmt          = newNamedSQL(lockStreamSQL)
	lockStreamReturningStmt = newNamedSQL(lockStreamReturningSQL)
	lockStreamsStmt         = newNamedSQL(lockStreamsSQL)
	decideStmt              = newNamedSQL(decideSQL)
	insertAuditStmt         = newNamedSQL(insertAuditSQL)
	streamStateStmt         = newNamedSQL(streamStateSQL)
	lookupStmt              = newNamedSQL(lookupSQL)
	writeStmt               = newNamedSQL(writeSQL)
	lockOutboundStmt        = newNamedSQL(lockOutboundStreamsSQL)
	outboundByKeyStmt       = newNamedSQL(outboundByKeySQL)
	topicEndpointsStmt      = newNamedSQL(topicEndpointsSQL)
	writeOutboundStmt       = newNamedSQL(writeOutboundSQL)
	claimStmt               = newNamedSQL(claimSQL)
	claimPlanModeStmt       = newNamedSQL(claimPlanModeSQL)
	dueTenantsStmt          = newNamedSQL(dueTenantsSQL)
	lockDueTenantStmt       = newNamedSQL(lockDueTenantSQL)
	raiseDueTenantStmt      = newNamedSQL(raiseDueTenantSQL)
	settleStmt              = newNamedSQL(settleSQL)
	messageExistsStmt       = newNamedSQL(messageExistsSQL)
	outboxMessageStmt       = newNamedSQL(outboxMessageSQL)
)
