// Command loadgen-delivery measures delivery-worker against a raw
// claim-and-settle loop; see package internal/loaddelivery.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/envelopeworker/envelopeworker/tools/internal/loaddelivery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := loaddelivery.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
