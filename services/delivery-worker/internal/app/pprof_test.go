package app

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
)

// Profiles are served only when asked for: off, /debug/pprof/ is not found;
// on, the index and a heap profile answer on the metrics listener.
func TestPprofOnlyWhenEnabled(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "s.json")
	if err := os.WriteFile(p, []byte(`{"ep":["`+secret(1)+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		enabled string
		want    int
	}{{"", http.StatusNotFound}, {"false", http.StatusNotFound}, {"true", http.StatusOK}} {
		addr, _, stop := start(t, map[string]string{
			"DATABASE_URL":         "postgres://nobody:pw@127.0.0.1:1/x?sslmode=disable&connect_timeout=1",
			"WEBHOOK_SECRETS_FILE": p,
			"PPROF_ENABLED":        c.enabled,
		})
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1"} {
			if code, _ := get(t, "http://"+addr+path); code != c.want {
				t.Errorf("PPROF_ENABLED=%q: %s answered %d, want %d", c.enabled, path, code, c.want)
			}
		}
		if err := stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
}
