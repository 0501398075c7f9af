package webhooksink

import (
	"context"
	"crypto/ed25519"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// Run is the webhook-sink command: it listens on --addr until ctx ends and
// returns the exit code (0 stopped cleanly, 1 failed, 2 bad command line).
// ready, if not nil, gets the bound address.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(net.Addr)) int {
	fs := flag.NewFlagSet("webhook-sink", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8099", "listen address")
	secretFile := fs.String("secret-file", "", "file with the endpoint's whsec_ secrets, one a line (required; never printed)")
	pubText := fs.String("envelope-public-key", "", "base64url Ed25519 public key of the tenant's outbound signing key; when set, envelope signatures are verified")
	tolerance := fs.Duration("tolerance", 5*time.Minute, "largest accepted distance between webhook-timestamp and now")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: webhook-sink --secret-file F [--addr A] [--envelope-public-key K] [--tolerance D]")
		fmt.Fprintln(stderr, "Receives outbox deliveries, checks them and prints one JSON line per request.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "webhook-sink: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	if *secretFile == "" {
		return usage("--secret-file is required")
	}
	data, err := os.ReadFile(*secretFile)
	if err != nil {
		return usage("%v", err)
	}
	var secrets [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		key, err := ParseSecret(line)
		if err != nil {
			return usage("%s line %d: %v", *secretFile, i+1, err)
		}
		secrets = append(secrets, key)
	}
	var pub ed25519.PublicKey
	if *pubText != "" {
		if pub, err = envelope.ParsePublicKey(*pubText); err != nil {
			return usage("--envelope-public-key: %v", err)
		}
	}
	sink, err := New(Config{Secrets: secrets, EnvelopeKey: pub, Tolerance: *tolerance, Out: stdout})
	if err != nil {
		return usage("%v", err)
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "webhook-sink: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: sink, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stderr, "webhook-sink: listening on %s\n", ln.Addr())
	if ready != nil {
		ready(ln.Addr())
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		fmt.Fprintf(stderr, "webhook-sink: %v\n", err)
		return 1
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		fmt.Fprintf(stderr, "webhook-sink: shutdown: %v\n", err)
		return 1
	}
	return 0
}
