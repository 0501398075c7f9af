package proccpu

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

func needProc(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skipf("no /proc here (not Linux): %v", err)
	}
}

// The /proc reading of this process and getrusage agree over a busy loop
// (the loop runs until getrusage has seen 100 ms of CPU: no clock in it).
func TestProcessAgreesWithGetrusage(t *testing.T) {
	needProc(t)
	r0, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	p0, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x := uint64(1)
	for {
		for range 1 << 16 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		r, err := Self()
		if err != nil {
			t.Fatal(err)
		}
		if r-r0 >= 100*time.Millisecond {
			break
		}
	}
	p1, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r1, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	dr, dp := r1-r0, p1-p0
	t.Logf("getrusage %v, /proc %v over the loop (%d)", dr, dp, x&1)
	// /proc counts whole ticks of 10 ms at either end.
	if dp < dr-30*time.Millisecond || dp > dr+30*time.Millisecond {
		t.Fatalf("/proc says %v, getrusage %v: want them within 30 ms", dp, dr)
	}
}

// The scan finds the backend of a connection this test opens, reads that
// backend's CPU rising while it works, and the server's total rises by at
// least as much.
func TestPostgresCountsTheBackend(t *testing.T) {
	needProc(t)
	ctx := context.Background()
	db, err := sql.Open("pgx", storetest.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx) // one backend for the whole test
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	s0, err := Postgres()
	if err != nil {
		t.Fatal(err)
	}
	if len(s0.PIDs) == 0 {
		t.Skip("no postgres process in /proc: the test server is not local (another host or PID namespace)")
	}
	if !slices.Contains(s0.PIDs, pid) {
		t.Fatalf("backend %d not among the postgres processes found %v", pid, s0.PIDs)
	}
	b0, err := Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := conn.QueryRowContext(ctx, `SELECT count(*) FROM generate_series(1, 1000000)`).Scan(&n); err != nil || n != 1000000 {
		t.Fatalf("busy query: %d, %v", n, err)
	}
	b1, err := Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := Postgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("backend %d: %v, server: %v over the query (%d postgres processes)", pid, b1-b0, s1.CPU-s0.CPU, len(s1.PIDs))
	if b1 <= b0 {
		t.Fatalf("backend %d CPU did not rise over a query of 1 M rows: %v then %v", pid, b0, b1)
	}
	if s1.CPU-s0.CPU < b1-b0 {
		t.Fatalf("server CPU rose %v, less than its backend's %v", s1.CPU-s0.CPU, b1-b0)
	}
}

// tools/loadgen-river keeps a copy of this package (it is a module of its
// own): everything below the package clause must be the same.
func TestLoadgenRiverCopyIsTheSame(t *testing.T) {
	body := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(b, []byte("\npackage "))
		if i < 0 {
			t.Fatalf("%s: no package clause", path)
		}
		_, rest, _ := bytes.Cut(b[i+1:], []byte("\n"))
		return rest
	}
	if !bytes.Equal(body("proccpu.go"), body("../../loadgen-river/proccpu.go")) {
		t.Fatal("tools/loadgen-river/proccpu.go differs from tools/internal/proccpu/proccpu.go below the package clause: copy it again")
	}
}
