// Command delivery-worker delivers the outbox of controlplane/v1: it claims
// due messages from PostgreSQL, POSTs each signed envelope to its webhook
// endpoint per Standard Webhooks, and settles the outcome under the claim's
// fencing token (see internal/worker). Configuration: delivery-worker -h.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/app"
)

func main() {
	// Answered before any setting is read: a version needs no database.
	if buildinfo.VersionRequested(os.Args[1:]) {
		buildinfo.Print(os.Stdout, "delivery-worker")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, nil)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "delivery-worker:", err)
		os.Exit(1)
	}
}
