package buildinfo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// ExitStatus is a failure already reported by the program itself (envctl
// prints its own messages): Main exits with it and prints nothing more.
type ExitStatus int

func (e ExitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Main is the whole of a binary's main function, the same for every binary:
// --version answered before any setting is read (a version needs no
// database), run called with the arguments (without the program name) and a
// context that SIGTERM or an interrupt cancels, and its error turned into the
// exit status. It does not return.
func Main(program string, run func(ctx context.Context, args []string) error) {
	os.Exit(mainStatus(program, os.Args[1:], os.Stdout, os.Stderr, run))
}

// mainStatus is Main without the process: the exit status. nil, and
// flag.ErrHelp after -h printed the usage, are 0; an ExitStatus is itself;
// any other error is printed as "<program>: <error>" and is 1.
func mainStatus(program string, args []string, stdout, stderr io.Writer, run func(ctx context.Context, args []string) error) int {
	if VersionRequested(args) {
		Print(stdout, program)
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, args)
	stop()
	var status ExitStatus
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &status):
		return int(status)
	}
	fmt.Fprintf(stderr, "%s: %v\n", program, err)
	return 1
}
