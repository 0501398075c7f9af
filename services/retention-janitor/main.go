// Command retention-janitor deletes expired inbound payloads once and exits;
// it runs as a Kubernetes CronJob. See internal/janitor for what a run does and
// retention-janitor -h for its configuration.
package main

import (
	"context"
	"os"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/app"
)

func main() {
	buildinfo.Main("retention-janitor", func(ctx context.Context, args []string) error {
		return app.Run(ctx, args, os.Getenv, os.Stdout)
	})
}
