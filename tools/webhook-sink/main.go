// Command webhook-sink receives outbox deliveries on a local address, checks
// their Standard Webhooks signature (and, optionally, the envelope's), and
// prints one JSON line per request; see package internal/webhooksink.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/envelopeworker/envelopeworker/tools/internal/webhooksink"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := webhooksink.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}
