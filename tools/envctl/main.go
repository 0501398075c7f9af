// Command envctl is the operator command line of envelopeworker; see package internal/envctl.
package main

import (
	"context"
	"os"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/tools/internal/envctl"
)

func main() {
	buildinfo.Main("envctl", func(ctx context.Context, args []string) error {
		// envctl reports its own failures; only the status is left.
		if code := envctl.Run(ctx, args, envctl.Env{
			Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
		}); code != envctl.ExitOK {
			return buildinfo.ExitStatus(code)
		}
		return nil
	})
}
