// Package app wires the retention-janitor together: configuration, the JSON
// logger and one run. main only calls Run.
package app

import (
	"context"
	"io"

	"github.com/envelopeworker/envelopeworker/modules/envflag"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/janitor"
)

// Run is the whole janitor process: configuration from args and getenv,
// JSON logs to stdout, one cycle, the summary line and the optional push.
// It returns flag.ErrHelp after -h, nil for a clean stop (including timeout,
// SIGTERM on ctx and a lock held by another run), and an error when the run
// failed.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	cfg, err := config.Load(args, getenv, stdout) // -h is asked-for output: stdout
	if err != nil {
		return err
	}
	return janitor.Run(ctx, cfg, envflag.Logger(stdout, cfg.LogLevel)) // LOG_LEVEL checked by config.Load
}
