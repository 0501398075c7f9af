package loadgen

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	sdk "github.com/envelopeworker/envelopeworker/modules/producer"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// sdkPlan fills p with the events of an SDK run: the same event ids, keys, payloads and issued_at as
// a raw run's envelopes, unsigned; the producer module numbers and signs them when it sends them.
func (p *Plan) sdkPlan(keys []ed25519.PrivateKey, envs [][][]byte, issued time.Time, pad string) (*Plan, error) {
	cfg := p.cfg
	p.signers = make([]*envelope.Signer, len(keys))
	for i, priv := range keys {
		pr := cfg.Creds.Producers[i]
		signer, err := envelope.NewSigner(pr.KeyID, priv)
		if err != nil {
			return nil, fmt.Errorf("producer %s: %w", pr.Device, err)
		}
		p.signers[i] = signer
		per := max(cfg.Batch, 1)
		n := len(envs[i])
		for start := 0; start < n; start += per {
			end := min(start+per, n)
			evs := make([]sdk.Event, 0, end-start)
			for seq := start + 1; seq <= end; seq++ {
				payload, err := json.Marshal(map[string]any{"n": seq, "pad": pad})
				if err != nil {
					return nil, err
				}
				evs = append(evs, sdk.Event{
					EventID: fmt.Sprintf("%s-%d", pr.Device, seq), IdempotencyKey: fmt.Sprintf("k-%s-%d", pr.Device, seq),
					Metadata: envelope.Metadata{Kind: "loadgen.sample"}, Payload: payload, IssuedAt: issued,
				})
			}
			p.work[i] = append(p.work[i], request{events: evs, n: len(evs)})
		}
	}
	return p, nil
}

// sdkProducers makes one producer per stream of an SDK run (nil for a raw run), each sending over
// its conn, and resumes them all before the clock starts (one stream read each).
func (p *Plan) sdkProducers(ctx context.Context, conns []*conn) ([]*sdk.Producer, error) {
	if p.signers == nil {
		return nil, nil
	}
	cfg := p.cfg
	out := make([]*sdk.Producer, len(conns))
	for i, c := range conns {
		pr := cfg.Creds.Producers[i]
		prod, err := sdk.New(cfg.URL.String(), p.clients[i], p.signers[i],
			sdk.WithStream(sdk.Stream{TenantID: cfg.Creds.Tenant, ProjectID: cfg.Project, ProducerID: pr.Device}),
			// A load generator never restarts a stream, so nothing needs to survive it; the file
			// store's two fsyncs a call would measure this machine's disk, not the service.
			sdk.WithStore(&sdk.MemoryStore{}),
			sdk.WithHTTPClient(&http.Client{Transport: connTransport{c}, Timeout: cfg.Timeout}),
			sdk.WithDeadline(cfg.Timeout), sdk.WithBackoff(10*time.Millisecond, time.Second), sdk.WithClock(cfg.Now))
		if err != nil {
			return nil, fmt.Errorf("producer %s: %w", pr.Device, err)
		}
		if _, err := prod.Resume(ctx); err != nil {
			return nil, fmt.Errorf("producer %s: resume: %w", pr.Device, err)
		}
		out[i] = prod
	}
	return out, nil
}

func sendSDK(ctx context.Context, pr *sdk.Producer, req request) ([]sdk.Result, error) {
	if len(req.events) == 1 {
		r, err := pr.Send(ctx, req.events[0])
		return []sdk.Result{r}, err
	}
	return pr.SendBatch(ctx, req.events)
}

// results counts an SDK call's answers: one status per envelope (the producer module retries 429 and
// 5xx itself, so only final answers show).
func (t *tally) results(rs []sdk.Result) {
	for _, r := range rs {
		t.statuses[r.Status]++
		t.outcome(wire.Answer{Outcome: r.Outcome, Reason: r.Reason}, 1)
	}
}

// sdkError counts an SDK call that returned no answers: undelivered is a transport failure, anything
// else (an event the module refused to sign) a refusal of its own.
func (t *tally) sdkError(err error, n int) {
	if errors.Is(err, sdk.ErrUndelivered) {
		t.transport++
		return
	}
	t.refused["sdk_local_error"] += n
}
