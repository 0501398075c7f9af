package envctl

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// partitionedParentsSQL lists the partitioned tables of the current schema
// that are not themselves partitions, and whether the current user may
// ANALYZE each: PostgreSQL 15 lets only a superuser, the table's owner or the
// database's owner do it (a member of either role counts), and skips any
// other with a warning instead of an error, so the check is made here.
const partitionedParentsSQL = `
SELECT c.relname,
       (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid),
       pg_has_role(current_user, c.relowner, 'USAGE')
           OR pg_has_role(current_user, (SELECT datdba FROM pg_database WHERE datname = current_database()), 'USAGE')
FROM pg_class c
WHERE c.relkind = 'p' AND c.relnamespace = current_schema()::regnamespace AND NOT c.relispartition
ORDER BY c.relname`

// runAnalyze gives the partitioned layout's parents the statistics
// autovacuum never gathers: it analyzes partitions only, while the planner
// estimates joins, groupings and generic plans over a partitioned table from
// its parent's statistics (docs/scaling.md, "Statistics"). ANALYZE of a
// parent samples every partition into the parent's statistics and
// re-analyzes each partition. On the plain layout there is nothing to do.
func runAnalyze(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	d := c.addDBFlags(fs, 30*time.Minute)
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	if fs.NArg() > 0 {
		return c.usageError(path, "unexpected argument %q", fs.Arg(0))
	}
	dsn, code := c.dsn(path, d)
	if dsn == "" {
		return code
	}
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	// Catalog statements, not the store's: like migrate, this talks to the database directly.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return c.failure(path, "cannot open the database: %v", err)
	}
	defer db.Close()
	fail := func(what string, err error) int {
		if errors.Is(err, context.DeadlineExceeded) {
			return c.failure(path, "timed out (see --timeout) %s", what)
		}
		return c.failure(path, "%s: %v", what, err)
	}
	type parent struct {
		name       string
		partitions int
		may        bool
	}
	rows, err := db.QueryContext(cctx, partitionedParentsSQL)
	if err != nil {
		return fail("cannot list the partitioned tables", err)
	}
	var parents []parent
	var refused []string
	for rows.Next() {
		var p parent
		if err := rows.Scan(&p.name, &p.partitions, &p.may); err != nil {
			rows.Close()
			return fail("cannot list the partitioned tables", err)
		}
		parents = append(parents, p)
		if !p.may {
			refused = append(refused, p.name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fail("cannot list the partitioned tables", err)
	}
	if len(refused) > 0 {
		// Nothing is analyzed: a partial run would look like a successful one in a CronJob's history.
		return c.failure(path, "this role may not analyze %s (only their owner, the database owner or a superuser may): run as the schema owner, as the migrate Job does",
			strings.Join(refused, ", "))
	}
	if len(parents) == 0 {
		fmt.Fprintln(c.Stdout, "no partitioned table (plain layout): nothing to analyze")
		return ExitOK
	}
	for _, p := range parents {
		started := time.Now()
		if _, err := db.ExecContext(cctx, `ANALYZE `+pgx.Identifier{p.name}.Sanitize()); err != nil {
			return fail("ANALYZE "+p.name, err)
		}
		fmt.Fprintf(c.Stdout, "analyzed %s and its %d partitions in %s\n", p.name, p.partitions, time.Since(started).Round(time.Millisecond))
	}
	return ExitOK
}
