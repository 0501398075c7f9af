// Command envctl is the operator command line of envelopeworker; see package internal/envctl.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/envelopeworker/envelopeworker/tools/internal/envctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := envctl.Run(ctx, os.Args[1:], envctl.Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
	})
	stop()
	os.Exit(code)
}
