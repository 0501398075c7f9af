package envctl

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// maxDraftFile bounds a draft file; the service takes at most 1 MiB per request and signatures only add.
const maxDraftFile = 1 << 20

func runSend(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	base := fs.String("url", "http://127.0.0.1:8080", "ingest-api base URL; plain http only to loopback hosts")
	tokenFile := fs.String("token-file", "", "file holding the bearer token (preferred: a --token shows in the process list)")
	token := fs.String("token", "", "the bearer token itself")
	seedFile := fs.String("seed-file", "", "file holding the producer's Ed25519 seed, base64url (required)")
	file := fs.String("file", "", "unsigned draft envelope (all members except signature; issued_at may be \"now\" or left out); - reads stdin (required)")
	batch := fs.Bool("batch", false, "the file holds {\"envelopes\":[drafts...]} or [drafts...]; POST them to /v1/envelopes/batch")
	idemHeader := fs.String("idempotency-header", "", "send this Idempotency-Key header (single route; \"=\" sends the draft's own key)")
	timeout := fs.Duration("timeout", 30*time.Second, "give up on the request after this long")
	stateFile := fs.String("state-file", "", "send as a device does, through the producer module: drafts leave out \"sequence\", which this file assigns and keeps with every unanswered envelope (re-sent first); prints one result a line")
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	u, err := access.CheckURL(*base, false)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	switch {
	case *tokenFile != "" && *token != "":
		return c.usageError(path, "give --token-file or --token, not both")
	case *tokenFile != "":
		if *token, err = access.ReadTokenFile(*tokenFile); err != nil {
			return c.usageError(path, "%v", err)
		}
	case *token != "":
		if err := access.CheckToken(*token); err != nil {
			return c.usageError(path, "--token: %v", err)
		}
	default:
		return c.usageError(path, "--token-file (or --token) is required")
	}
	if *seedFile == "" {
		return c.usageError(path, "--seed-file is required")
	}
	priv, err := access.ReadSeedFile(*seedFile)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	if *file == "" {
		return c.usageError(path, "--file is required")
	}
	if *batch && *idemHeader != "" {
		return c.usageError(path, "--idempotency-header applies to the single route only")
	}
	if *stateFile != "" && *idemHeader != "" {
		return c.usageError(path, "--idempotency-header does not apply with --state-file")
	}
	if *timeout <= 0 {
		return c.usageError(path, "--timeout must be positive")
	}
	data, err := c.readDraft(*file)
	if err != nil {
		return c.usageError(path, "%v", err)
	}

	if *stateFile != "" {
		return c.sendThroughProducer(ctx, path, u.String(), *token, priv, data, *batch, *stateFile, *timeout)
	}

	var body []byte
	route := wire.RouteEnvelopes
	header := http.Header{}
	now := c.Now()
	if *batch {
		route = wire.RouteBatch
		drafts, err := parseDraftBatch(data, now, true)
		if err != nil {
			return c.usageError(path, "%s: %v", *file, err)
		}
		if body, err = signBatch(drafts, priv); err != nil {
			return c.usageError(path, "%s: %v", *file, err)
		}
	} else {
		d, err := parseDraft(data, now, true)
		if err != nil {
			return c.usageError(path, "%s: %v", *file, err)
		}
		e, err := envelope.Sign(d, priv)
		if err != nil {
			return c.usageError(path, "%s: cannot sign: %v", *file, err)
		}
		body = e.Canonical()
		switch *idemHeader {
		case "":
		case "=":
			header.Set("Idempotency-Key", d.IdempotencyKey)
		default:
			header.Set("Idempotency-Key", *idemHeader)
		}
	}

	client := c.HTTPClient
	if client == nil {
		client = &http.Client{CheckRedirect: noRedirect}
	}
	rctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	ans, err := access.Post(rctx, client, access.Endpoint(u, route), *token, body, header)
	if err != nil {
		return c.failure(path, "%v", err)
	}
	fmt.Fprintf(c.Stdout, "HTTP %d\n", ans.Status)
	c.Stdout.Write(bytes.TrimRight(ans.Body, "\n"))
	fmt.Fprintln(c.Stdout)
	if ans.Status < 200 || ans.Status > 299 {
		return ExitFailure
	}
	return ExitOK
}

// noRedirect keeps the bearer token from following a redirect to wherever it points.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func (c *cli) readDraft(file string) ([]byte, error) {
	var r io.Reader
	if file == "-" {
		r = c.Stdin
	} else {
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxDraftFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	if len(data) > maxDraftFile {
		return nil, fmt.Errorf("%s is larger than %d bytes, the service's request limit", file, maxDraftFile)
	}
	return data, nil
}

func signBatch(drafts []envelope.Draft, priv ed25519.PrivateKey) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"envelopes":[`)
	for i, d := range drafts {
		e, err := envelope.Sign(d, priv)
		if err != nil {
			return nil, fmt.Errorf("item %d: cannot sign: %w", i, err)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e.Canonical())
	}
	b.WriteString(`]}`)
	return b.Bytes(), nil
}

func runKeygen(ctx context.Context, c *cli, path string, args []string) int {
	fs := c.flagSet(path)
	seedFile := fs.String("seed-file", "", "write the seed to this new file (mode 0600, never overwritten) and print only the public key")
	if done, code := c.parse(fs, path, args); done {
		return code
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return c.failure(path, "generate: %v", err)
	}
	seed := access.EncodeBase64URL(priv.Seed())
	pubText := access.EncodeBase64URL(pub)
	if *seedFile == "" {
		out, _ := json.Marshal(map[string]string{"seed": seed, "public_key": pubText})
		fmt.Fprintf(c.Stdout, "%s\n", out)
		return ExitOK
	}
	if err := access.WriteSecretFile(*seedFile, seed+"\n"); err != nil {
		return c.failure(path, "%v", err)
	}
	fmt.Fprintln(c.Stdout, pubText)
	return ExitOK
}
