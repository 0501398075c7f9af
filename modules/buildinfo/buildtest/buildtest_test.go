package buildtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

const hello = "modules/buildinfo/buildtest/testdata/hello"

func runs(t *testing.T, bin string) {
	t.Helper()
	out, err := exec.Command(bin).Output()
	if err != nil || strings.TrimSpace(string(out)) != "hello from buildtest" {
		t.Fatalf("%s: %q, %v", bin, out, err)
	}
}

func TestFallbackBuildsIntoTheCallersDirectory(t *testing.T) {
	t.Setenv(DirEnv, "")
	dir := t.TempDir()
	bin := Binary(t, hello, dir)
	if bin != filepath.Join(dir, "hello") {
		t.Fatalf("built %s, want it in %s", bin, dir)
	}
	runs(t, bin)
}

// Processes of one run share the directory: concurrent callers get one build, later ones reuse it.
func TestSharedDirectoryBuildsOnce(t *testing.T) {
	shared := t.TempDir()
	t.Setenv(DirEnv, shared)
	bins := make([]string, 4)
	var wg sync.WaitGroup
	for i := range bins {
		wg.Go(func() {
			b, err := binary(hello, "")
			if err != nil {
				t.Error(err)
			}
			bins[i] = b
		})
	}
	wg.Wait()
	want := filepath.Join(shared, filepath.FromSlash(hello), "hello")
	for _, b := range bins {
		if b != want {
			t.Fatalf("got %v, want every path %s", bins, want)
		}
	}
	runs(t, want)
	before, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	if b := Binary(t, hello, t.TempDir()); b != want {
		t.Fatalf("second ask: %s, want %s", b, want)
	}
	after, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	if !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("the binary was built again: modified %v, then %v", before.ModTime(), after.ModTime())
	}
	if _, err := os.Stat(want + ".partial"); !os.IsNotExist(err) {
		t.Errorf("a partial build was left behind: %v", err)
	}
}

func TestRefusesPathsOutsideTheRepository(t *testing.T) {
	for _, pkg := range []string{"../elsewhere", "/usr/bin", ""} {
		if _, err := binary(pkg, t.TempDir()); err == nil {
			t.Errorf("%q: built", pkg)
		}
	}
}
