// Command ingest-api is the hosted inbound side of controlplane/v1: it
// authenticates, rate-limits, verifies and durably commits signed envelopes
// (see internal/server). Configuration: ingest-api -h.
package main

import (
	"context"
	"os"
	"runtime/debug"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/app"
)

// gcPercent is the GC target unless GOGC is set. A request leaves almost
// nothing live behind (the heap stays in the tens of MB), so collecting at 4x
// the live heap instead of 2x costs little memory and, on a 2 vCPU VM, gave
// 6 % more envelopes/s at 64 producers (docs/benchmarks.md). GOMEMLIMIT, set
// in the Deployment, still bounds the heap under a memory limit.
const gcPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	buildinfo.Main("ingest-api", func(ctx context.Context, args []string) error {
		return app.Run(ctx, args, os.Getenv, os.Stdout, nil)
	})
}
