// Package buildinfo is the one home of a binary's version: what --version
// prints and what the build_info gauge exports; and of what every main does
// around its program (Main: --version, the signal context, the exit status).
// Every binary imports it; it imports no module of this repository, so no
// binary depends on another.
//
// The version and revision come from the Go toolchain's build information
// (runtime/debug.ReadBuildInfo): the main module's version when built with
// `go install module@version`, and the VCS revision when built inside a git
// checkout. Image builds have neither (no .git in the build context, a
// workspace-relative main module), so the Dockerfiles set both with
//
//	-ldflags "-X github.com/envelopeworker/envelopeworker/modules/buildinfo.version=0.2.0
//	          -X github.com/envelopeworker/envelopeworker/modules/buildinfo.revision=<git sha>"
//
// and a value given that way wins over the build information.
package buildinfo

import (
	"fmt"
	"io"
	"runtime/debug"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// Set with -ldflags -X at build time; empty means "ask the toolchain".
var (
	version  string
	revision string
)

// Unknown stands for a version or revision nobody recorded, so the gauge's
// labels are never empty (an empty label is indistinguishable from absent).
const Unknown = "unknown"

// MetricName is the gauge every binary exports (and the janitor pushes).
const MetricName = "envelopeworker_build_info"

// Info identifies a build. None of it is secret or per-tenant.
type Info struct {
	Version   string
	Revision  string
	GoVersion string
}

// Get returns the build's identity: -ldflags values first, then the build
// information the toolchain embedded, then Unknown.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	return fromBuildInfo(bi, ok, version, revision)
}

func fromBuildInfo(bi *debug.BuildInfo, ok bool, ldVersion, ldRevision string) Info {
	in := Info{Version: ldVersion, Revision: ldRevision}
	if ok {
		in.GoVersion = bi.GoVersion
		// "(devel)" is what the toolchain says for a build of a local
		// checkout: it is not a version.
		if in.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			in.Version = bi.Main.Version
		}
		if in.Revision == "" {
			if i := slices.IndexFunc(bi.Settings, func(s debug.BuildSetting) bool { return s.Key == "vcs.revision" }); i >= 0 {
				in.Revision = bi.Settings[i].Value
				if j := slices.IndexFunc(bi.Settings, func(s debug.BuildSetting) bool { return s.Key == "vcs.modified" }); j >= 0 && bi.Settings[j].Value == "true" {
					in.Revision += "-dirty"
				}
			}
		}
	}
	if in.Version == "" {
		in.Version = Unknown
	}
	if in.Revision == "" {
		in.Revision = Unknown
	}
	if in.GoVersion == "" {
		in.GoVersion = Unknown
	}
	return in
}

// String is the --version line: "<program> <version> (revision <rev>, <go version>)".
func (in Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", in.Version, in.Revision, in.GoVersion)
}

// Collector is the build_info gauge: constantly 1, the build in its labels,
// so a query can join any series with the version that produced it.
func (in Info) Collector() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: MetricName,
		Help: "Always 1; the labels name the build of the binary (version, revision, go_version).",
		ConstLabels: prometheus.Labels{
			"version":    in.Version,
			"revision":   in.Revision,
			"go_version": in.GoVersion,
		},
	}, func() float64 { return 1 })
}

// VersionRequested reports whether args (without the program name) ask for
// the version alone: a binary answers it before reading any configuration, so
// `--version` works without a database or a single setting.
func VersionRequested(args []string) bool {
	return len(args) == 1 && (args[0] == "--version" || args[0] == "-version")
}

// Print writes "<program> <Info>" and a newline: the answer to --version.
func Print(w io.Writer, program string) {
	fmt.Fprintf(w, "%s %s\n", program, Get())
}
