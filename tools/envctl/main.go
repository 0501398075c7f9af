// Command envctl is the operator command line of envelopeworker; see package internal/envctl.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/tools/internal/envctl"
)

func main() {
	// Answered before any setting is read: a version needs no database.
	if buildinfo.VersionRequested(os.Args[1:]) {
		buildinfo.Print(os.Stdout, "envctl")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := envctl.Run(ctx, os.Args[1:], envctl.Env{
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Getenv: os.Getenv,
	})
	stop()
	os.Exit(code)
}
