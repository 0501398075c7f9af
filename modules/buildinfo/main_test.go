package buildinfo

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestMainStatus(t *testing.T) {
	cases := []struct {
		name        string
		args        []string
		err         error
		status      int
		ran         bool
		out, errOut string
	}{
		{name: "version", args: []string{"--version"}, status: 0, out: "prog " + Get().String() + "\n"},
		{name: "version among flags is a setting", args: []string{"--version", "-x"}, status: 0, ran: true},
		{name: "clean stop", status: 0, ran: true},
		{name: "help", args: []string{"-h"}, err: fmt.Errorf("parse: %w", flag.ErrHelp), status: 0, ran: true},
		{name: "failure", err: errors.New("open store: refused"), status: 1, ran: true, errOut: "prog: open store: refused\n"},
		{name: "reported by the program", err: ExitStatus(2), status: 2, ran: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			ran := false
			status := mainStatus("prog", c.args, &out, &errOut, func(ctx context.Context, args []string) error {
				ran = true
				if ctx.Err() != nil {
					t.Error("context cancelled before run")
				}
				if strings.Join(args, " ") != strings.Join(c.args, " ") {
					t.Errorf("args %q, want %q", args, c.args)
				}
				return c.err
			})
			if status != c.status || ran != c.ran || out.String() != c.out || errOut.String() != c.errOut {
				t.Fatalf("status %d ran %v out %q err %q; want %d %v %q %q", status, ran, out.String(), errOut.String(), c.status, c.ran, c.out, c.errOut)
			}
		})
	}
}
