// Command delivery-worker delivers the outbox of controlplane/v1: it claims
// due messages from PostgreSQL, POSTs each signed envelope to its webhook
// endpoint per Standard Webhooks, and settles the outcome under the claim's
// fencing token (see internal/worker). Configuration: delivery-worker -h.
package main

import (
	"context"
	"os"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/app"
)

func main() {
	buildinfo.Main("delivery-worker", func(ctx context.Context, args []string) error {
		return app.Run(ctx, args, os.Getenv, os.Stdout, nil)
	})
}
