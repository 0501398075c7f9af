package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// model is the contract's stream semantics, written as plainly as possible.
type model struct {
	held     map[int64]string // sequence -> event id
	byEvent  map[string]int64
	floor    int64
	maxAhead int64
}

func (m *model) cursor() int64 {
	c := int64(0)
	for {
		next := c + 1
		if _, ok := m.held[next]; ok || next <= m.floor {
			c = next
			continue
		}
		return c
	}
}

func (m *model) ingest(eventID string, seq int64) (store.Outcome, string) {
	if s, ok := m.byEvent[eventID]; ok {
		if s == seq {
			return store.OutcomeDuplicate, ""
		}
		return store.OutcomeRefused, store.ReasonEventConflict
	}
	switch {
	case seq <= m.floor:
		return store.OutcomeRefused, store.ReasonBelowReplayFloor
	case m.held[seq] != "":
		return store.OutcomeRefused, store.ReasonSequenceConflict
	case seq > m.cursor()+m.maxAhead:
		return store.OutcomeRefused, store.ReasonSequenceTooFarAhead
	}
	m.held[seq] = eventID
	m.byEvent[eventID] = seq
	return store.OutcomeAccepted, ""
}

func TestCursorAgainstModel(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	const n = 40
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		producer := fmt.Sprintf("prop%d", seed)
		a := actor("t1", producer)
		m := &model{held: map[int64]string{}, byEvent: map[string]int64{}, maxAhead: 8}
		// A permutation of 1..n with some sequences never sent (gaps), some
		// sent twice, some sent under a second event id, and floors raised
		// at random points.
		order := r.Perm(n)
		steps := 0
		for _, i := range order {
			seq := int64(i + 1)
			if r.IntN(10) == 0 {
				continue
			}
			tries := 1 + r.IntN(2)
			for k := 0; k < tries; k++ {
				eventID := fmt.Sprintf("%s-s%d", producer, seq)
				if r.IntN(8) == 0 {
					eventID = fmt.Sprintf("%s-s%d-alt", producer, seq)
				}
				e := env{tenant: "t1", project: "p1", producer: producer, eventID: eventID, seq: seq}
				in := e.input()
				in.MaxAhead = m.maxAhead
				got := mustIngest(t, f.s, a, in)
				wantOutcome, wantReason := m.ingest(eventID, seq)
				if got.Outcome != wantOutcome || got.Reason != wantReason || got.Cursor != m.cursor() {
					t.Fatalf("seed %d step %d seq %d %s: got %+v, model %s/%s cursor %d",
						seed, steps, seq, eventID, got, wantOutcome, wantReason, m.cursor())
				}
				steps++
			}
			if r.IntN(12) == 0 {
				floor := m.floor + int64(r.IntN(6))
				st, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", producer, floor)
				if err != nil {
					t.Fatalf("seed %d: SetReplayFloor(%d): %v", seed, floor, err)
				}
				m.floor = floor
				if st.ReplayFloor != floor || st.Cursor != m.cursor() {
					t.Fatalf("seed %d: floor %d gave %+v, model cursor %d", seed, floor, st, m.cursor())
				}
			}
			if r.IntN(15) == 0 && m.floor > 0 {
				if _, err := f.s.Inbound().SetReplayFloor(ctx, "t1", "p1", producer, m.floor-1); !errors.Is(err, store.ErrConflict) {
					t.Fatalf("seed %d: lowering the floor: %v, want ErrConflict", seed, err)
				}
			}
		}
		st, err := f.s.Inbound().Stream(ctx, "t1", "p1", producer)
		if err != nil || st.Cursor != m.cursor() || st.ReplayFloor != m.floor {
			t.Fatalf("seed %d: Stream = %+v, %v; model cursor %d floor %d", seed, st, err, m.cursor(), m.floor)
		}
		if got := f.count(`SELECT count(*) FROM event_identities WHERE producer_id = $1`, producer); got != len(m.held) {
			t.Fatalf("seed %d: %d identities stored, model holds %d", seed, got, len(m.held))
		}
	}
}
