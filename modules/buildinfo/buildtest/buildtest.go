// Package buildtest compiles this repository's commands for tests that run them as processes (the
// end-to-end harness, the worker's kill tests, the load and chaos tools).
//
// Each such test package used to `go build` the binaries it runs: GOCACHE holds the compiled
// packages, but every build links the binary again, and test packages running side by side compiled
// the same uncached packages at the same time. scripts/test.sh names one directory for the whole run
// in DirEnv; the first test process to ask for a command builds it there and every later one, in any
// package, reuses it. Without DirEnv (`go test` in one module) each caller builds into a directory of
// its own, as before.
package buildtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// DirEnv names the directory shared by the test processes of one run. scripts/test.sh creates it
// empty and removes it afterwards; nothing else may write there while the run lasts, since a binary
// found there is taken as built from the current sources.
const DirEnv = "ENVELOPEWORKER_TEST_BIN"

// Binary returns the path of the command in pkg, a slash-separated directory relative to the
// repository root ("services/ingest-api", "tools/envctl"), built with `go build`: into DirEnv's
// directory once per run when it is set, otherwise into fallbackDir (which the caller owns).
func Binary(t testing.TB, pkg, fallbackDir string) string {
	t.Helper()
	bin, err := binary(pkg, fallbackDir)
	if err != nil {
		t.Fatalf("buildtest: %v", err)
	}
	return bin
}

func binary(pkg, fallbackDir string) (string, error) {
	if !filepath.IsLocal(filepath.FromSlash(pkg)) {
		return "", fmt.Errorf("%q is not a directory inside the repository", pkg)
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, filepath.FromSlash(pkg))
	name := filepath.Base(src)
	shared := os.Getenv(DirEnv)
	if shared == "" {
		bin := filepath.Join(fallbackDir, name)
		return bin, build(src, bin)
	}
	// One subdirectory per package keeps two commands of the same name apart.
	dir := filepath.Join(shared, filepath.FromSlash(pkg))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// The lock makes a second process asking for the same command wait for the first one's build
	// instead of compiling beside it.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("lock %s: %w", dir, err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	bin := filepath.Join(dir, name)
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	// Built under another name and renamed, so a binary at bin is always a complete one.
	tmp := bin + ".partial"
	if err := build(src, tmp); err != nil {
		return "", err
	}
	return bin, os.Rename(tmp, bin)
}

func build(src, out string) error {
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = src
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", src, err, b)
	}
	return nil
}

// repoRoot is the nearest directory above the working directory (a test's package directory) that
// holds go.work.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for start := dir; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work in %s or above it", start)
		}
		dir = parent
	}
}
