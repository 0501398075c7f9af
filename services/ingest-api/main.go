// Command ingest-api is the hosted inbound side of controlplane/v1: it
// authenticates, rate-limits, verifies and durably commits signed envelopes
// (see internal/server). Configuration: ingest-api -h.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr, nil)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ingest-api:", err)
		os.Exit(1)
	}
}
