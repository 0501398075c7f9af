// Command retention-janitor deletes expired inbound payloads once and exits;
// it runs as a Kubernetes CronJob. See internal/janitor for what a run does and
// retention-janitor -h for its configuration.
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
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/app"
)

func main() {
	// Answered before any setting is read: a version needs no database.
	if buildinfo.VersionRequested(os.Args[1:]) {
		buildinfo.Print(os.Stdout, "retention-janitor")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "retention-janitor:", err)
		os.Exit(1)
	}
}
