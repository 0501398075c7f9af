package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// maxAnswerBytes bounds what is read of an answer; a batch answer of 100
// results is a few KiB.
const maxAnswerBytes = 1 << 20

// deliver sends batch until every envelope has an answer or the deadline
// passes. The result slice always has one entry per envelope; an entry with
// no Outcome got no answer, and then the error is ErrUndelivered.
//
// Items a batch answer marks 429 or 503 (the limiter ran out part-way, or
// the service failed) were not processed, so they are sent again after a
// backoff; whole-request 429 and 5xx are retried inside the HTTP client.
func (p *Producer) deliver(ctx context.Context, batch []Pending) ([]Result, error) {
	rs := make([]Result, len(batch))
	todo := make([]int, len(batch))
	for i := range todo {
		todo[i] = i
	}
	for round := 0; ; round++ {
		answers, err := p.post(ctx, batch, todo)
		if err != nil {
			return rs, err
		}
		var again []int
		for k, i := range todo {
			a := answers[k]
			if a.Status == http.StatusTooManyRequests || a.Status >= 500 {
				again = append(again, i)
				continue
			}
			rs[i] = resultOf(batch[i], a)
		}
		if len(again) == 0 {
			return rs, nil
		}
		todo = again
		wait := backoff(p.cfg.backoffMin, p.cfg.backoffMax, round, nil)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return rs, fmt.Errorf("%w: %d of %d envelopes: %w", ErrUndelivered, len(todo), len(batch), ctx.Err())
		case <-t.C:
		}
	}
}

func resultOf(pd Pending, a wire.BatchResult) Result {
	r := Result{
		Sequence: pd.Sequence, EventID: pd.EventID, EventIdentity: a.EventIdentity, Outcome: a.Outcome, Reason: a.Reason,
		Detail: a.Detail, Status: a.Status, CorrelationID: a.CorrelationID,
	}
	if a.Cursor != nil {
		r.Cursor = *a.Cursor
	}
	return r
}

// post sends the envelopes batch[todo...]: one on the single route, more on
// the batch route, and returns one answer per envelope. A whole-request
// refusal of a batch (401, 403, 413, a malformed wrapper) is that answer for
// every envelope.
func (p *Producer) post(ctx context.Context, batch []Pending, todo []int) ([]wire.BatchResult, error) {
	route := wire.RouteEnvelopes
	var body []byte
	if len(todo) == 1 {
		body = batch[todo[0]].Envelope
	} else {
		route = wire.RouteBatch
		// The wrapper envelope.SplitBatch reads; the envelopes go in as the
		// canonical bytes that were saved, never re-encoded.
		body = append(body, `{"envelopes":[`...)
		for k, i := range todo {
			if k > 0 {
				body = append(body, ',')
			}
			body = append(body, batch[i].Envelope...)
		}
		body = append(body, "]}"...)
	}
	seqs := make([]int64, len(todo))
	for k, i := range todo {
		seqs[k] = batch[i].Sequence
	}
	status, raw, err := p.do(ctx, http.MethodPost, route, body, seqs)
	if err != nil {
		return nil, err
	}
	if status == http.StatusTooManyRequests || status >= 500 {
		return nil, fmt.Errorf("%w: the service answered %d until the deadline", ErrUndelivered, status)
	}
	var whole wire.Answer
	if len(todo) == 1 || status != http.StatusOK {
		if err := json.Unmarshal(raw, &whole); err != nil || !consistent(whole, status) {
			return nil, fmt.Errorf("%w: answer %d is not a contract answer", ErrUndelivered, status)
		}
		out := make([]wire.BatchResult, len(todo))
		for k := range out {
			out[k] = wire.BatchResult{Answer: whole, Status: status}
		}
		return out, nil
	}
	var ba wire.BatchAnswer
	if err := json.Unmarshal(raw, &ba); err != nil || len(ba.Results) != len(todo) {
		return nil, fmt.Errorf("%w: batch answer does not have one result per envelope", ErrUndelivered)
	}
	for _, r := range ba.Results {
		if !consistent(r.Answer, r.Status) {
			return nil, fmt.Errorf("%w: a batch result is not a contract answer", ErrUndelivered)
		}
	}
	return ba.Results, nil
}

// consistent reports whether an answer's outcome agrees with its status as
// the contract pairs them. Anything else (a proxy's page, a 3xx, a 4xx that
// claims acceptance) is no answer: the envelope stays pending, and a
// re-send is safe because a repeat is a duplicate.
func consistent(a wire.Answer, status int) bool {
	switch {
	case status == http.StatusOK:
		return a.Outcome == wire.OutcomeAccepted || a.Outcome == wire.OutcomeDuplicate
	case status == http.StatusTooManyRequests || status >= 500:
		return true // not processed; sent again whatever the body says
	case status >= 400:
		return a.Outcome == wire.OutcomeRefused && a.Reason != ""
	default:
		return false
	}
}

// readStream reads the stream's cursor and replay floor.
func (p *Producer) readStream(ctx context.Context) (wire.StreamState, error) {
	var ss wire.StreamState
	status, raw, err := p.do(ctx, http.MethodGet, wire.StreamPath(p.cfg.stream.ProjectID, p.cfg.stream.ProducerID), nil, nil)
	if err != nil {
		return ss, fmt.Errorf("producer: read stream: %w", err)
	}
	if status != http.StatusOK {
		var a wire.Answer
		if json.Unmarshal(raw, &a) == nil && a.Outcome == wire.OutcomeRefused && status < 500 && status != http.StatusTooManyRequests {
			return ss, &RefusalError{Status: status, Reason: a.Reason, CorrelationID: a.CorrelationID}
		}
		return ss, fmt.Errorf("producer: read stream: %w: status %d", ErrUndelivered, status)
	}
	if err := json.Unmarshal(raw, &ss); err != nil {
		return ss, fmt.Errorf("producer: read stream: answer is not a stream state: %w", err)
	}
	return ss, nil
}

// do makes one request with retries and returns the final status and body.
// The body is given as bytes so every retry sends exactly the same ones.
func (p *Producer) do(ctx context.Context, method, route string, body []byte, seqs []int64) (int, []byte, error) {
	if p.cfg.observe != nil {
		ctx = context.WithValue(ctx, exchangeKey{}, Attempt{Method: method, Route: route, Sequences: seqs})
	}
	var rb any
	if body != nil {
		rb = body
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, method, p.base+route, rb)
	if err != nil {
		return 0, nil, fmt.Errorf("producer: build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+p.credential)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, nil, fmt.Errorf("%w: %w", ErrUndelivered, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: read answer: %w", ErrUndelivered, err)
	}
	return resp.StatusCode, raw, nil
}

// exchangeKey carries, in a request's context, what checkRetry reports of
// the request: retryablehttp hands CheckRetry only the context and answer.
type exchangeKey struct{}

// checkRetry decides with retryable and reports the attempt to the
// observer. It reads the answer into memory so that the observer and do
// both see it; retryablehttp drains the copy before a retry.
func (p *Producer) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	retry, cerr := retryable(ctx, resp, err)
	a, ok := ctx.Value(exchangeKey{}).(Attempt)
	if !ok {
		return retry, cerr
	}
	a.Retry = retry
	switch {
	case err != nil:
		a.Err = err
	case resp != nil:
		raw, rerr := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		resp.Body.Close()
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(raw), failedRead{rerr}))
		if rerr != nil {
			a.Err = rerr
			break
		}
		a.Status = resp.StatusCode
		var ba wire.BatchAnswer
		if a.Route == wire.RouteBatch && a.Status == http.StatusOK && json.Unmarshal(raw, &ba) == nil {
			a.Results = ba.Results
		} else if json.Unmarshal(raw, &a.Answer) != nil {
			a.Answer = wire.Answer{}
		}
	}
	p.cfg.observe(a)
	return retry, cerr
}

// failedRead hands do the error the observer's read met, so a cut answer
// is still no answer.
type failedRead struct{ err error }

func (f failedRead) Read([]byte) (int, error) {
	if f.err == nil {
		return 0, io.EOF
	}
	return 0, f.err
}

// retryable retries what the contract says is safe to retry: 429, 5xx (a
// 5xx never acknowledges anything), timeouts and connection errors. Any
// other answer, refusals included, is final.
func retryable(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		// The library's policy retries transport errors except those that
		// cannot heal (bad scheme, invalid header, untrusted certificate).
		return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
	}
	return resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500, nil
}

// backoff honours Retry-After on 429 and 503 (the deadline still bounds
// the wait); otherwise it waits
// min·2^attempt capped at max, drawn from its upper half so that many
// producers do not retry in step.
func backoff(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
	if resp != nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		if s, err := strconv.ParseInt(resp.Header.Get(wire.HeaderRetryAfter), 10, 64); err == nil && s >= 0 {
			return time.Duration(s) * time.Second
		}
	}
	d := min
	for i := 0; i < attempt && d < max; i++ {
		d *= 2 // min <= max, so this stops before it can overflow
	}
	d = time.Duration(math.Min(float64(d), float64(max)))
	return d/2 + rand.N(d/2+1)
}
