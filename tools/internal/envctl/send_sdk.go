package envctl

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	sdk "github.com/envelopeworker/envelopeworker/modules/producer"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// sendResult is one line of `envctl send --state-file`.
type sendResult struct {
	EventID  string       `json:"event_id"`
	Sequence int64        `json:"sequence"`
	Outcome  wire.Outcome `json:"outcome"`
	Reason   wire.Reason  `json:"reason,omitempty"`
	Status   int          `json:"status"`
	Cursor   int64        `json:"cursor,omitempty"`
	// Resent marks an envelope an earlier run left unanswered, re-sent first.
	Resent bool `json:"resent,omitempty"`
}

// sendThroughProducer sends the drafts as a device does, through the producer module: sequences come
// from the state file, every envelope is saved there before it is sent, what an earlier run left
// unanswered is re-sent first, and only 429, 5xx and transport failures are retried (until timeout).
// All drafts must be of one stream and key id, as one device's producer is.
func (c *cli) sendThroughProducer(ctx context.Context, path, base, token string, priv ed25519.PrivateKey, data []byte, batch bool, stateFile string, timeout time.Duration) int {
	now := c.Now()
	var drafts []envelope.Draft
	if batch {
		ds, err := parseDraftBatch(data, now, false)
		if err != nil {
			return c.usageError(path, "%v", err)
		}
		drafts = ds
	} else {
		d, err := parseDraft(data, now, false)
		if err != nil {
			return c.usageError(path, "%v", err)
		}
		drafts = []envelope.Draft{d}
	}
	first := drafts[0]
	events := make([]sdk.Event, len(drafts))
	for i, d := range drafts {
		if d.TenantID != first.TenantID || d.ProjectID != first.ProjectID || d.ProducerID != first.ProducerID || d.KeyID != first.KeyID {
			return c.usageError(path, "with --state-file every draft must have the same tenant, project, producer and key id")
		}
		events[i] = sdk.Event{EventID: d.EventID, IdempotencyKey: d.IdempotencyKey, Metadata: d.Metadata, Payload: d.Payload, IssuedAt: d.IssuedAt}
	}
	signer, err := envelope.NewSigner(first.KeyID, priv)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	opts := []sdk.Option{
		sdk.WithStream(sdk.Stream{TenantID: first.TenantID, ProjectID: first.ProjectID, ProducerID: first.ProducerID}),
		sdk.WithStore(sdk.NewFileStore(stateFile)), sdk.WithDeadline(timeout), sdk.WithClock(c.Now),
	}
	if c.HTTPClient != nil {
		opts = append(opts, sdk.WithHTTPClient(c.HTTPClient))
	}
	p, err := sdk.New(base, token, signer, opts...)
	if err != nil {
		return c.usageError(path, "%v", err)
	}
	ok := true
	show := func(r sdk.Result, resent bool) {
		ok = ok && r.Delivered()
		line, _ := json.Marshal(sendResult{EventID: r.EventID, Sequence: r.Sequence, Outcome: r.Outcome, Reason: r.Reason, Status: r.Status, Cursor: r.Cursor, Resent: resent})
		c.Stdout.Write(append(line, '\n'))
	}
	resent, err := p.Resume(ctx)
	for _, r := range resent {
		show(r, true)
	}
	if err != nil {
		return c.failure(path, "%v", sendError(err))
	}
	var results []sdk.Result
	if len(events) == 1 && !batch {
		var r sdk.Result
		r, err = p.Send(ctx, events[0])
		results = []sdk.Result{r}
	} else {
		results, err = p.SendBatch(ctx, events)
	}
	if err != nil {
		return c.failure(path, "%v", sendError(err))
	}
	for _, r := range results {
		show(r, false)
	}
	if !ok {
		return ExitFailure
	}
	return ExitOK
}

// sendError adds what to do to the producer's errors that need an action.
func sendError(err error) error {
	if errors.Is(err, sdk.ErrUndelivered) {
		return errors.New(err.Error() + " (kept in the state file: run envctl send --state-file again to re-send)")
	}
	return err
}
