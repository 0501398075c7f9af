package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestFromBuildInfo(t *testing.T) {
	vcs := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"},
	}}
	installed := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.2.0"}}
	cases := []struct {
		name     string
		bi       *debug.BuildInfo
		ok       bool
		ldV, ldR string
		want     Info
	}{
		{"checkout", vcs, true, "", "", Info{Unknown, "abc123-dirty", "go1.26.0"}},
		{"go install", installed, true, "", "", Info{"v0.2.0", Unknown, "go1.26.0"}},
		{"ldflags win", vcs, true, "0.2.0", "def456", Info{"0.2.0", "def456", "go1.26.0"}},
		{"no build info", nil, false, "", "", Info{Unknown, Unknown, Unknown}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := fromBuildInfo(tc.bi, tc.ok, tc.ldV, tc.ldR); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(Info{"0.2.0", "abc", "go1.26.0"}.Collector())
	want := `# HELP envelopeworker_build_info Always 1; the labels name the build of the binary (version, revision, go_version).
# TYPE envelopeworker_build_info gauge
envelopeworker_build_info{go_version="go1.26.0",revision="abc",version="0.2.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), MetricName); err != nil {
		t.Fatal(err)
	}
}

func TestVersionRequested(t *testing.T) {
	for args, want := range map[string]bool{"--version": true, "-version": true, "--version -h": false, "": false, "-h": false} {
		if got := VersionRequested(strings.Fields(args)); got != want {
			t.Errorf("VersionRequested(%q) = %v, want %v", args, got, want)
		}
	}
}
