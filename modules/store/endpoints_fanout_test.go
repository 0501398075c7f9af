package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// topicEndpoint is an endpoint of (t1, p1, wide), the topic these tests fill.
func topicEndpoint(n int, state store.EndpointState) store.Endpoint {
	return store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "wide", State: state,
		URL: fmt.Sprintf("https://hooks.example.test/wide/%d", n), SecretRef: "sec-t1-wide"}
}

func (f *fixture) activeOn(tenant, project, topic string) int {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM endpoints WHERE tenant_id = $1 AND project_id = $2 AND topic = $3 AND state = 'active'`,
		tenant, project, topic)
}

// fillTopic adds n active endpoints to (t1, p1, wide) and returns their ids.
func fillTopic(t *testing.T, s *store.Store, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := s.Outbox().AddEndpoint(context.Background(), topicEndpoint(i, ""))
		if err != nil {
			t.Fatalf("add endpoint %d of %d: %v", i+1, n, err)
		}
		ids[i] = id
	}
	return ids
}

// Contract §8.12: 64 active endpoints a topic; the 65th add and an enable that would make 65 are
// refused with ErrTopicFull, and nothing is written. Disabled endpoints do not count.
func TestEndpointTopicHoldsAtMostMaxTopicEndpoints(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if store.MaxTopicEndpoints != 64 {
		t.Fatalf("MaxTopicEndpoints = %d; contract §8.12 says 64", store.MaxTopicEndpoints)
	}

	// Disabled endpoints first: they take no slot, before or after the topic is full.
	var disabled []string
	for i := range 3 {
		id, err := f.s.Outbox().AddEndpoint(ctx, topicEndpoint(100+i, store.EndpointDisabled))
		if err != nil {
			t.Fatalf("add disabled endpoint: %v", err)
		}
		disabled = append(disabled, id)
	}
	active := fillTopic(t, f.s, store.MaxTopicEndpoints)
	if n := f.activeOn("t1", "p1", "wide"); n != store.MaxTopicEndpoints {
		t.Fatalf("%d active endpoints after %d adds", n, store.MaxTopicEndpoints)
	}

	before := f.count(`SELECT count(*) FROM endpoints`)
	_, err := f.s.Outbox().AddEndpoint(ctx, topicEndpoint(64, ""))
	wantErr(t, "65th add", err, store.ErrTopicFull)
	if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrInvalid) {
		t.Fatalf("65th add: %v is also another kind", err)
	}
	// A caller-chosen id is refused the same way, before its id is looked at.
	chosen := topicEndpoint(65, store.EndpointActive)
	chosen.ID = "ep_0000000000000000000000ff"
	_, err = f.s.Outbox().AddEndpoint(ctx, chosen)
	wantErr(t, "65th add with an id", err, store.ErrTopicFull)
	if after := f.count(`SELECT count(*) FROM endpoints`); after != before {
		t.Fatalf("refused adds wrote rows: %d -> %d", before, after)
	}

	// Enabling a disabled endpoint would make 65: refused, and it stays disabled with its reason.
	wantErr(t, "enable at the bound", f.s.Outbox().SetEndpointState(ctx, "t1", disabled[0], store.EndpointActive, ""), store.ErrTopicFull)
	if e, err := f.s.Outbox().GetEndpoint(ctx, "t1", disabled[0]); err != nil || e.State != store.EndpointDisabled {
		t.Fatalf("refused enable changed the endpoint: %+v, %v", e, err)
	}
	// Enabling one that is active already is no new slot, and disabling is never refused.
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", active[0], store.EndpointActive, ""); err != nil {
		t.Fatalf("enable an active endpoint of a full topic: %v", err)
	}
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", disabled[1], store.EndpointDisabled, "operator"); err != nil {
		t.Fatalf("disable in a full topic: %v", err)
	}
	// A disabled add is still taken: it is no slot.
	if _, err := f.s.Outbox().AddEndpoint(ctx, topicEndpoint(66, store.EndpointDisabled)); err != nil {
		t.Fatalf("disabled add to a full topic: %v", err)
	}
	// The bound is per (tenant, project, topic).
	for _, e := range []store.Endpoint{
		{TenantID: "t1", ProjectID: "p1", Topic: "narrow"},
		{TenantID: "t1", ProjectID: "p2", Topic: "wide"},
		{TenantID: "t2", ProjectID: "p1", Topic: "wide"},
	} {
		e.URL, e.SecretRef = "https://hooks.example.test/other", "sec-"+e.TenantID+"-other"
		if _, err := f.s.Outbox().AddEndpoint(ctx, e); err != nil {
			t.Fatalf("add to %s/%s/%s next to a full topic: %v", e.TenantID, e.ProjectID, e.Topic, err)
		}
	}

	// A slot freed by a disable is taken by an enable, then the topic is full again.
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", active[1], store.EndpointDisabled, "operator"); err != nil {
		t.Fatalf("disable: %v", err)
	}
	if err := f.s.Outbox().SetEndpointState(ctx, "t1", disabled[0], store.EndpointActive, ""); err != nil {
		t.Fatalf("enable into the freed slot: %v", err)
	}
	wantErr(t, "enable after the slot was taken", f.s.Outbox().SetEndpointState(ctx, "t1", active[1], store.EndpointActive, ""), store.ErrTopicFull)
	_, err = f.s.Outbox().AddEndpoint(ctx, topicEndpoint(67, ""))
	wantErr(t, "add after the slot was taken", err, store.ErrTopicFull)
	if n := f.activeOn("t1", "p1", "wide"); n != store.MaxTopicEndpoints {
		t.Fatalf("%d active endpoints, want %d", n, store.MaxTopicEndpoints)
	}
	// Unknown ids are still not found, not full.
	wantErr(t, "enable unknown", f.s.Outbox().SetEndpointState(ctx, "t1", "ep_ffffffffffffffffffffffff", store.EndpointActive, ""), store.ErrNotFound)
}

// Adds and enables racing for the last slots of a topic, as the operator role (the grants must
// allow the guard): exactly the free slots are taken, every other call is ErrTopicFull. Also on a
// database whose default isolation is REPEATABLE READ, where a count after the lock would still
// see the snapshot from before it unless the store asks for READ COMMITTED.
func TestEndpointTopicGuardIsRaceFree(t *testing.T) {
	for _, iso := range []string{"", "repeatable read"} {
		t.Run("default "+iso, func(t *testing.T) {
			t.Parallel()
			raceTopicGuard(t, iso)
		})
	}
}

func raceTopicGuard(t *testing.T, isolation string) {
	f := newFixture(t)
	ctx := context.Background()
	if isolation != "" {
		var db string
		if err := f.admin.QueryRowContext(ctx, `SELECT quote_ident(current_database())`).Scan(&db); err != nil {
			t.Fatal(err)
		}
		if _, err := f.admin.ExecContext(ctx, `ALTER DATABASE `+db+` SET default_transaction_isolation = '`+isolation+`'`); err != nil {
			t.Fatal(err)
		}
	}
	operator := storetest.Open(t, storetest.DSNForRole(f.dsn, roleOperator))
	const racers, free = 16, 4
	fillTopic(t, operator, store.MaxTopicEndpoints-free)
	var disabled []string
	for i := range racers / 2 {
		id, err := operator.Outbox().AddEndpoint(ctx, topicEndpoint(200+i, store.EndpointDisabled))
		if err != nil {
			t.Fatalf("add disabled: %v", err)
		}
		disabled = append(disabled, id)
	}

	for round := range 3 {
		start := make(chan struct{})
		errs := make([]error, racers)
		var wg sync.WaitGroup
		for i := range racers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if i%2 == 0 {
					_, errs[i] = operator.Outbox().AddEndpoint(ctx, topicEndpoint(1000*(round+1)+i, ""))
				} else {
					errs[i] = operator.Outbox().SetEndpointState(ctx, "t1", disabled[i/2], store.EndpointActive, "")
				}
			}()
		}
		close(start)
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, store.ErrTopicFull):
				t.Fatalf("round %d, racer %d: %v", round, i, err)
			}
		}
		if n := f.activeOn("t1", "p1", "wide"); n != store.MaxTopicEndpoints || won != free {
			t.Fatalf("round %d: %d calls won, %d endpoints active; want %d won, %d active",
				round, won, n, free, store.MaxTopicEndpoints)
		}
		// Free the slots again: disable the round's winners (the newest writes), then race enables
		// on endpoints that are disabled now (enabling an active one takes no slot).
		ids, err := topicIDs(f, store.EndpointActive)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids[len(ids)-free:] {
			if err := operator.Outbox().SetEndpointState(ctx, "t1", id, store.EndpointDisabled, "operator"); err != nil {
				t.Fatal(err)
			}
		}
		if disabled, err = topicIDs(f, store.EndpointDisabled); err != nil || len(disabled) < racers/2 {
			t.Fatalf("%d disabled endpoints, %v", len(disabled), err)
		}
	}
}

// topicIDs lists the endpoints of (t1, p1, wide) in state, oldest write first.
func topicIDs(f *fixture, state store.EndpointState) ([]string, error) {
	var ids string
	err := f.admin.QueryRow(`SELECT coalesce(string_agg(endpoint_id, ',' ORDER BY updated_at, endpoint_id), '')
		FROM endpoints WHERE tenant_id = 't1' AND project_id = 'p1' AND topic = 'wide' AND state = $1`, string(state)).Scan(&ids)
	if err != nil || ids == "" {
		return nil, err
	}
	return strings.Split(ids, ","), nil
}

// Rows written past the guard (here by the table owner) never make an enqueue write more than
// MaxTopicEndpoints messages: the first endpoints by id get one each, the rest none, on the
// first enqueue and its repeat alike.
func TestEnqueueWritesAtMostMaxTopicEndpoints(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	fillTopic(t, f.s, store.MaxTopicEndpoints)
	// Past the guard: the smallest and the largest possible ids, so the cut shows its order.
	for _, id := range []string{"ep_000000000000000000000000", "ep_ffffffffffffffffffffffff"} {
		if _, err := f.admin.ExecContext(ctx, `INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
			VALUES ('t1', $1, 'p1', 'wide', 'https://hooks.example.test/by-hand', 'sec-t1-wide')`, id); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := topicIDs(f, store.EndpointActive)
	if err != nil || len(ids) != store.MaxTopicEndpoints+2 {
		t.Fatalf("%d active endpoints, %v", len(ids), err)
	}
	slices.Sort(ids)

	o := out("k-wide", `{"wide":true}`)
	o.topic = "wide"
	r := f.enqueue(actor("t1", "svc1"), o)
	if len(r.MessageIDs) != store.MaxTopicEndpoints {
		t.Fatalf("enqueue wrote %d messages, want %d", len(r.MessageIDs), store.MaxTopicEndpoints)
	}
	got, err := messageEndpoints(f, r.MessageIDs)
	if err != nil {
		t.Fatal(err)
	}
	if want := ids[:store.MaxTopicEndpoints]; !slices.Equal(got, want) {
		t.Fatalf("messages went to %v,\nwant the first %d by id %v", got, store.MaxTopicEndpoints, want)
	}
	if n := f.count(`SELECT count(*) FROM outbox_messages`); n != store.MaxTopicEndpoints {
		t.Fatalf("%d outbox rows, want %d", n, store.MaxTopicEndpoints)
	}
	if rep := f.enqueue(actor("t1", "svc1"), o); rep.Created || !slices.Equal(rep.MessageIDs, r.MessageIDs) {
		t.Fatalf("repeat: %+v, want the original %d ids", rep, len(r.MessageIDs))
	}
}

// messageEndpoints returns the endpoint of each message, sorted.
func messageEndpoints(f *fixture, msgs []string) ([]string, error) {
	var out []string
	for _, m := range msgs {
		st, err := f.s.Outbox().OutboxMessage(context.Background(), "t1", m)
		if err != nil {
			return nil, err
		}
		out = append(out, st.EndpointID)
	}
	slices.Sort(out)
	return out, nil
}
