package store

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkNamedArgsRewrite is what named arguments cost a hot statement on
// the client, per call: pgx's rewrite of @name to $n (a scan of the whole
// text, which pgx.StrictNamedArgs does every call) against a namedSQL's,
// rewritten once, which only orders the arguments. decideSQL is the longest
// statement an Ingest sends, settleSQL the longest of a settle.
func BenchmarkNamedArgsRewrite(b *testing.B) {
	for _, q := range []struct {
		name string
		stmt *namedSQL
	}{{"decide", decideStmt}, {"settle", settleStmt}} {
		args := pgx.StrictNamedArgs{}
		for _, n := range q.stmt.names {
			args[n] = 1
		}
		for _, r := range []struct {
			name string
			rw   pgx.QueryRewriter
		}{{"pgx", args}, {"once", q.stmt.bind(args)}} {
			b.Run(q.name+"/"+r.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if _, _, err := r.rw.RewriteQuery(context.Background(), nil, q.stmt.text, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
