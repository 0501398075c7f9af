// Command loadgen-ingest sets up producers and drives ingest-api over loopback HTTP; see
// package internal/loadgen.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/envelopeworker/envelopeworker/tools/internal/loadgen"
)

func main() {
	// The generator shares the machine with what it measures: collect less often (its heap is the
	// signed envelopes, allocated once).
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := loadgen.Main(ctx, os.Args[1:], loadgen.Env{Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv})
	stop()
	os.Exit(code)
}
