package store_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func TestOutboxEnqueueNewRepeatConflict(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "svc1")
	ep1 := f.addEndpoint("t1", "p1", "task.proposals")
	ep2 := f.addEndpoint("t1", "p1", "task.proposals")

	o := out("k-1", `{"kind":"proposal"}`)
	first := f.enqueue(a, o)
	if !first.Created || len(first.MessageIDs) != 2 || seqOf(t, first.Envelope) != 1 || o.builds.Load() != 1 {
		t.Fatalf("first enqueue: created %v, ids %v, seq %d, builds %d",
			first.Created, first.MessageIDs, seqOf(t, first.Envelope), o.builds.Load())
	}
	for _, id := range first.MessageIDs {
		m := f.status("t1", id)
		if m.Status != store.StatusPending || m.Attempts != 0 || m.Topic != "task.proposals" ||
			m.NextAttemptAt == nil || m.DeliveredAt != nil || m.LastErrorCode != "" {
			t.Fatalf("new message %s: %+v", id, m)
		}
	}
	gotEndpoints := []string{f.status("t1", first.MessageIDs[0]).EndpointID, f.status("t1", first.MessageIDs[1]).EndpointID}
	wantEndpoints := []string{ep1, ep2}
	slices.Sort(wantEndpoints)
	if !slices.Equal(gotEndpoints, wantEndpoints) {
		t.Fatalf("message endpoints %v, want %v (ordered by endpoint id)", gotEndpoints, wantEndpoints)
	}
	if n := f.count(`SELECT count(*) FROM outbound_envelopes`); n != 1 {
		t.Fatalf("%d stored envelopes, want the envelope once", n)
	}

	again := f.enqueue(a, o)
	if again.Created || !bytes.Equal(again.Envelope, first.Envelope) || !slices.Equal(again.MessageIDs, first.MessageIDs) {
		t.Fatalf("repeat: created %v, same envelope %v, ids %v want %v",
			again.Created, bytes.Equal(again.Envelope, first.Envelope), again.MessageIDs, first.MessageIDs)
	}
	if o.builds.Load() != 1 {
		t.Fatalf("repeat built a new envelope (%d builds)", o.builds.Load())
	}

	other := out("k-1", `{"kind":"other"}`)
	_, err := f.s.Outbox().Enqueue(ctx, a, other.request())
	wantErr(t, "same key, other content", err, store.ErrIdempotencyConflict)
	if other.builds.Load() != 0 {
		t.Fatal("conflicting request built an envelope")
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages`); n != 2 {
		t.Fatalf("%d messages after repeat and conflict, want 2", n)
	}

	// Neither the repeat nor the conflict took a sequence.
	if next := f.enqueue(a, out("k-2", `{}`)); seqOf(t, next.Envelope) != 2 {
		t.Fatalf("next sequence %d, want 2", seqOf(t, next.Envelope))
	}

	// A repeat still answers after its endpoints were disabled.
	for _, ep := range []string{ep1, ep2} {
		if err := f.s.Outbox().SetEndpointState(ctx, "t1", ep, store.EndpointDisabled, "operator"); err != nil {
			t.Fatal(err)
		}
	}
	if r := f.enqueue(a, o); r.Created || !slices.Equal(r.MessageIDs, first.MessageIDs) {
		t.Fatalf("repeat after disable: %+v", r)
	}
}

func TestOutboxEnqueueNoEndpointTakesNoSequence(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := actor("t1", "svc1")
	// Subscriptions that do not match (t1, p1, task.proposals).
	f.addEndpoint("t1", "p1", "other.topic")
	f.addEndpoint("t1", "p2", "task.proposals")
	f.addEndpoint("t2", "p1", "task.proposals")
	disabled := f.addEndpoint("t1", "p1", "task.proposals")
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", disabled, store.EndpointDisabled, "http_410"); err != nil {
		t.Fatal(err)
	}
	o := out("k-1", `{}`)
	for i := 0; i < 3; i++ {
		_, err := f.s.Outbox().Enqueue(ctx, a, o.request())
		wantErr(t, "no active endpoint", err, store.ErrNoEndpoint)
	}
	if o.builds.Load() != 0 || f.count(`SELECT count(*) FROM outbound_streams`) != 0 ||
		f.count(`SELECT count(*) FROM outbound_envelopes`) != 0 || f.count(`SELECT count(*) FROM outbox_messages`) != 0 {
		t.Fatal("a refused enqueue left state behind")
	}
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", disabled, store.EndpointActive, ""); err != nil {
		t.Fatal(err)
	}
	r := f.enqueue(a, o)
	if !r.Created || seqOf(t, r.Envelope) != 1 || len(r.MessageIDs) != 1 {
		t.Fatalf("after enabling: created %v, seq %d, %d messages", r.Created, seqOf(t, r.Envelope), len(r.MessageIDs))
	}
}

func TestOutboxEnqueueSequencesPerOutboundStream(t *testing.T) {
	f := newFixture(t)
	for _, tp := range [][2]string{{"t1", "p1"}, {"t1", "p2"}, {"t2", "p1"}} {
		f.addEndpoint(tp[0], tp[1], "task.proposals")
	}
	cases := []struct {
		tenant, project, producer string
		want                      int64
	}{
		{"t1", "p1", "svc1", 1}, {"t1", "p1", "svc1", 2}, {"t1", "p1", "svc2", 1}, {"t1", "p1", "svc1", 3},
		{"t1", "p2", "svc1", 1}, {"t2", "p1", "svc1", 1}, {"t1", "p1", "svc2", 2},
	}
	for i, c := range cases {
		o := out("k-"+string(rune('a'+i)), `{}`)
		o.project, o.producer = c.project, c.producer
		r := f.enqueue(actor(c.tenant, c.producer), o)
		if got := seqOf(t, r.Envelope); got != c.want {
			t.Fatalf("case %d (%s/%s/%s): sequence %d, want %d", i, c.tenant, c.project, c.producer, got, c.want)
		}
	}
	// Outbound streams are not inbound streams.
	if n := f.count(`SELECT count(*) FROM streams`); n != 0 {
		t.Fatalf("outbound enqueues created %d inbound streams", n)
	}
	st, err := f.s.Inbound().Stream(context.Background(), "t1", "p1", "svc1")
	if err != nil || st.Cursor != 0 || st.ReplayFloor != 0 {
		t.Fatalf("inbound stream of the outbound producer: %+v, %v", st, err)
	}
}

func TestOutboxEnqueueFansOutToActiveEndpointsOnly(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	active := []string{f.addEndpoint("t1", "p1", "task.proposals"), f.addEndpoint("t1", "p1", "task.proposals")}
	off := f.addEndpoint("t1", "p1", "task.proposals")
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", off, store.EndpointDisabled, "operator"); err != nil {
		t.Fatal(err)
	}
	o := out("k-1", `{}`)
	o.maxAttempts = 3
	r := f.enqueue(actor("t1", "svc1"), o)
	var got []string
	for _, id := range r.MessageIDs {
		got = append(got, f.status("t1", id).EndpointID)
	}
	slices.Sort(active)
	if !slices.Equal(got, active) {
		t.Fatalf("messages for endpoints %v, want the active ones %v", got, active)
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages WHERE max_attempts = 3 AND budget = 3 AND attempts = 0`); n != 2 {
		t.Fatalf("%d messages carry the request's attempt budget, want 2", n)
	}
}

func TestOutboxEnqueueRefusesBadInput(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	good := func() store.EnqueueRequest { return out("k-1", `{}`).request() }
	cases := map[string]func(*store.Actor, *store.EnqueueRequest){
		"max attempts 0":  func(_ *store.Actor, r *store.EnqueueRequest) { r.MaxAttempts = 0 },
		"max attempts 51": func(_ *store.Actor, r *store.EnqueueRequest) { r.MaxAttempts = 51 },
		"no build":        func(_ *store.Actor, r *store.EnqueueRequest) { r.Build = nil },
		"bad project":     func(_ *store.Actor, r *store.EnqueueRequest) { r.ProjectID = "p 1" },
		"bad producer":    func(_ *store.Actor, r *store.EnqueueRequest) { r.ProducerID = "" },
		"bad topic":       func(_ *store.Actor, r *store.EnqueueRequest) { r.Topic = "task/proposals" },
		"bad tenant":      func(a *store.Actor, _ *store.EnqueueRequest) { a.TenantID = "" },
		"bad identity": func(_ *store.Actor, r *store.EnqueueRequest) {
			r.Build = func(int64) ([]byte, string, error) { return []byte(`{}`), "ABC", nil }
		},
		"empty envelope": func(_ *store.Actor, r *store.EnqueueRequest) {
			r.Build = func(int64) ([]byte, string, error) { return nil, string(bytes.Repeat([]byte("a"), 64)), nil }
		},
	}
	for name, mutate := range cases {
		a, r := actor("t1", "svc1"), good()
		mutate(&a, &r)
		_, err := f.s.Outbox().Enqueue(ctx, a, r)
		wantErr(t, name, err, store.ErrInvalid)
	}
	signErr := errors.New("signing key unavailable")
	r := good()
	r.Build = func(int64) ([]byte, string, error) { return nil, "", signErr }
	_, err := f.s.Outbox().Enqueue(ctx, actor("t1", "svc1"), r)
	if !errors.Is(err, signErr) {
		t.Fatalf("build failure: %v, want the build error", err)
	}
	if f.count(`SELECT count(*) FROM outbound_streams`) != 0 || f.count(`SELECT count(*) FROM outbox_messages`) != 0 {
		t.Fatal("a failed enqueue left state behind")
	}
	if r := f.enqueue(actor("t1", "svc1"), out("k-1", `{}`)); seqOf(t, r.Envelope) != 1 {
		t.Fatalf("sequence after refusals %d, want 1", seqOf(t, r.Envelope))
	}
}

// The same key from several producers of one project at once: the stream
// locks differ, so the unique index decides and the losers answer repeat.
func TestOutboxEnqueueConcurrentSameKey(t *testing.T) {
	f := newFixture(t)
	f.addEndpoint("t1", "p1", "task.proposals")
	f.addEndpoint("t1", "p1", "task.proposals")
	const n = 8
	results := make([]store.EnqueueResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := out("k-same", `{"same":true}`)
			o.producer = []string{"svc1", "svc2"}[i%2]
			results[i], errs[i] = f.s.Outbox().Enqueue(context.Background(), actor("t1", o.producer), o.request())
		}()
	}
	wg.Wait()
	created := 0
	for i := range results {
		if errs[i] != nil {
			t.Fatalf("enqueue %d: %v", i, errs[i])
		}
		if results[i].Created {
			created++
		}
		if !bytes.Equal(results[i].Envelope, results[0].Envelope) || !slices.Equal(results[i].MessageIDs, results[0].MessageIDs) {
			t.Fatalf("enqueue %d answered another envelope or ids", i)
		}
	}
	if created != 1 || f.count(`SELECT count(*) FROM outbox_messages`) != 2 ||
		f.count(`SELECT coalesce(sum(last_sequence), 0) FROM outbound_streams`) != 1 {
		t.Fatalf("created %d times, %d messages, %d sequences taken; want 1, 2, 1", created,
			f.count(`SELECT count(*) FROM outbox_messages`), f.count(`SELECT coalesce(sum(last_sequence), 0) FROM outbound_streams`))
	}
}
