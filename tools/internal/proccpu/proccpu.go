// Package proccpu reads the CPU time of processes, for the load generators'
// "where does the CPU go per message" figures: a child process's and the
// PostgreSQL server's from Linux /proc, the calling process's own from
// getrusage.
//
// tools/loadgen-river is a module of its own, outside go.work (River's pgx
// stays out of the services' graph), and cannot import this package without
// requiring the whole tools module: it keeps a copy of everything below the
// package clause in tools/loadgen-river/proccpu.go, and this package's tests
// fail when the two differ.
package proccpu

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's times
// (getconf CLK_TCK): the kernel reports them in 1/100 s on every
// architecture Go builds for (only alpha and ia64 used another value), so
// it is a constant rather than a sysconf call Go's standard library lacks.
const clockTicksPerSecond = 100

// procTimes are the four time fields of /proc/<pid>/stat.
type procTimes struct {
	ppid           int
	utime, stime   int64 // the process's own (all its threads)
	cutime, cstime int64 // its waited-for children's, once reaped
	comm           string
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicksPerSecond }

// readStat parses /proc/<pid>/stat. The command name (field 2) is in
// parentheses and may hold spaces and parentheses itself, so the fields
// are counted from the last ')'.
func readStat(pid int) (procTimes, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procTimes{}, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procTimes{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	// After ')': state(3) ppid(4) … utime(14) stime(15) cutime(16) cstime(17).
	f := strings.Fields(s[end+1:])
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("/proc/%d/stat: %d fields after the command name", pid, len(f))
	}
	var n [5]int64
	for i, idx := range []int{1, 11, 12, 13, 14} {
		if n[i], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return procTimes{}, fmt.Errorf("/proc/%d/stat: field %d: %w", pid, idx+3, err)
		}
	}
	return procTimes{ppid: int(n[0]), utime: n[1], stime: n[2], cutime: n[3], cstime: n[4], comm: s[open+1 : end]}, nil
}

// Process is the user+system CPU a live process has used so far (all its
// threads; not its children). It fails when /proc is not there (not Linux)
// or the process has exited.
func Process(pid int) (time.Duration, error) {
	t, err := readStat(pid)
	if err != nil {
		return 0, err
	}
	return ticks(t.utime + t.stime), nil
}

// Self is the user+system CPU the calling process has used so far, from
// getrusage (microseconds, finer than /proc's ticks).
func Self() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// PostgresSample is the CPU of the PostgreSQL server at one instant: every
// process named "postgres" (postmaster, backends, background workers),
// plus the reaped children of each postmaster, so a backend that exits
// between two samples still counts (its time moves into its postmaster's
// children's time). Every server on the machine is counted, and all of
// each server's work, whoever asked for it: the difference of two samples
// is the server's CPU between them only when nothing else uses it.
type PostgresSample struct {
	CPU  time.Duration
	PIDs []int // the postgres processes found, postmasters included
}

// Postgres scans /proc for the PostgreSQL server's processes. A process
// that exits during the scan is skipped (its time is in its postmaster's
// children's time, or will be once reaped). No postgres process is not an
// error: PIDs is empty.
func Postgres() (PostgresSample, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return PostgresSample{}, fmt.Errorf("list /proc: %w", err)
	}
	found := map[int]procTimes{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		// comm, not the command line: PostgreSQL rewrites its argv into
		// "postgres: user db host state", the kernel's name stays.
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		t, err := readStat(pid)
		if err != nil {
			continue
		}
		found[pid] = t
	}
	var s PostgresSample
	var n int64
	for pid, t := range found {
		n += t.utime + t.stime
		if _, child := found[t.ppid]; !child { // a postmaster: its parent is no postgres
			n += t.cutime + t.cstime
		}
		s.PIDs = append(s.PIDs, pid)
	}
	s.CPU = ticks(n)
	return s, nil
}

// Mark is the CPU at one instant of the calling process, of some other
// processes and of the PostgreSQL server: two marks bound a measured
// window.
type Mark struct {
	At            time.Time
	Self          time.Duration // the calling process (Self)
	Others        time.Duration // the processes Take was given, summed (Process)
	Postgres      time.Duration // the PostgreSQL server (Postgres)
	PostgresProcs int           // postgres processes found; 0: the server is not on this machine
}

// Take reads a Mark. The others must be alive; a process started after
// the window's first mark is left out of that one, as it had used nothing.
func Take(others ...int) (Mark, error) {
	m := Mark{At: time.Now()}
	var err error
	if m.Self, err = Self(); err != nil {
		return Mark{}, err
	}
	for _, pid := range others {
		c, err := Process(pid)
		if err != nil {
			return Mark{}, err
		}
		m.Others += c
	}
	pg, err := Postgres()
	if err != nil {
		return Mark{}, err
	}
	m.Postgres, m.PostgresProcs = pg.CPU, len(pg.PIDs)
	return m, nil
}

// MicrosPer is d in microseconds per one of n, to 0.1 µs.
func MicrosPer(d time.Duration, n int) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)/float64(n)*10) / 10
}

// Cores is CPU time d over wall time: the cores it kept busy, to 0.01.
func Cores(d, wall time.Duration) float64 {
	return math.Round(d.Seconds()/wall.Seconds()*100) / 100
}
