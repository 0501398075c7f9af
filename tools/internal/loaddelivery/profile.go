package loaddelivery

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// profiler collects what --profile-dir asks for: the first worker's CPU
// profile over the drain (PPROF_ENABLED on a metrics address picked here)
// and the drain's statements from pg_stat_statements, reset just before the
// workers start.
type profiler struct {
	dir, addr string
	seconds   int
	pgss      bool
	cpuErr    chan error
}

func newProfiler(ctx context.Context, db *sql.DB, c Config) (*profiler, error) {
	if err := os.MkdirAll(c.ProfileDir, 0o755); err != nil {
		return nil, err
	}
	// A free loopback port for the worker's metrics (and so pprof) listener.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	p := &profiler{dir: c.ProfileDir, addr: addr, seconds: c.ProfileSeconds, cpuErr: make(chan error, 1)}
	var loaded bool
	if err := db.QueryRowContext(ctx, `SELECT 'pg_stat_statements' = ANY (string_to_array(current_setting('shared_preload_libraries'), ','))`).
		Scan(&loaded); err != nil {
		return nil, fmt.Errorf("shared_preload_libraries: %w", err)
	}
	if loaded {
		if _, err := db.ExecContext(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
			return nil, fmt.Errorf("pg_stat_statements: %w", err)
		}
		if _, err := db.ExecContext(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
			return nil, fmt.Errorf("pg_stat_statements_reset: %w", err)
		}
		p.pgss = true
	}
	return p, nil
}

// cpuOnFirstReceipt takes the CPU profile once deliveries have begun.
func (p *profiler) cpuOnFirstReceipt(ctx context.Context, snk *sink) {
	select {
	case <-snk.started:
	case <-ctx.Done():
		p.cpuErr <- ctx.Err()
		return
	}
	p.cpuErr <- p.fetch(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", p.seconds), "worker-cpu.pprof")
}

func (p *profiler) fetch(ctx context.Context, path, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: time.Duration(p.seconds+10) * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile: %s", resp.Status)
	}
	f, err := os.Create(filepath.Join(p.dir, file))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// finish waits for the CPU profile and writes the statements of the drain.
func (p *profiler) finish(ctx context.Context, db *sql.DB) error {
	if err := <-p.cpuErr; err != nil {
		return err
	}
	if !p.pgss {
		return nil
	}
	rows, err := db.QueryContext(ctx, `
SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3), rows,
       shared_blks_hit + shared_blks_read, wal_records, regexp_replace(query, '\s+', ' ', 'g')
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT 15`)
	if err != nil {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer rows.Close()
	var b strings.Builder
	b.WriteString("calls\ttotal_ms\tmean_ms\trows\tblocks\twal_records\tquery\n")
	for rows.Next() {
		var calls, rowsN, blocks, wal int64
		var total, mean, query string
		if err := rows.Scan(&calls, &total, &mean, &rowsN, &blocks, &wal, &query); err != nil {
			return err
		}
		if len(query) > 160 {
			query = query[:160] + "…"
		}
		fmt.Fprintf(&b, "%d\t%s\t%s\t%d\t%d\t%d\t%s\n", calls, total, mean, rowsN, blocks, wal, query)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.dir, "pg-statements.txt"), []byte(b.String()), 0o644)
}
