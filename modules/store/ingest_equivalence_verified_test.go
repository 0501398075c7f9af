package store_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// keyClass is what the verified-with check of an input must find: the key
// named by the input active with the public key it was verified with, or one
// of the ways it no longer is.
type keyClass string

const (
	keyUnchecked keyClass = "unchecked" // no VerifiedWith: decided whatever the key
	keyActive    keyClass = "active"
	keyRetired   keyClass = "retired"
	keyRevoked   keyClass = "revoked"
	keyPruned    keyClass = "pruned"
	keyReplaced  keyClass = "replaced" // the key id is active with another public key
)

// keyModel is what the test believes producer_keys holds, per tenant and key id.
type keyModel map[string]map[string]struct {
	state store.KeyState
	pub   ed25519.PublicKey
}

func (m keyModel) class(tenant string, in *store.IngestInput) keyClass {
	if in.VerifiedWith == nil {
		return keyUnchecked
	}
	k, ok := m[tenant][in.KeyID]
	switch {
	case !ok:
		return keyPruned
	case !bytes.Equal(k.pub, in.VerifiedWith):
		return keyReplaced
	case k.state == store.KeyRetired:
		return keyRetired
	case k.state == store.KeyRevoked:
		return keyRevoked
	}
	return keyActive
}

// keyOps applies the same key changes to both fixtures and to the model, so
// that the two stores under comparison always hold the same keys.
type keyOps struct {
	t     *testing.T
	fs    []*fixture
	model keyModel
}

func (o *keyOps) each(what string, op func(s *store.Store) error) {
	o.t.Helper()
	for _, f := range o.fs {
		if err := op(f.s); err != nil {
			o.t.Fatalf("%s: %v", what, err)
		}
	}
}

func (o *keyOps) add(tenant, keyID string, pub ed25519.PublicKey) {
	o.each("add "+keyID, func(s *store.Store) error { return s.Credentials().AddKey(context.Background(), tenant, keyID, pub) })
	if o.model[tenant] == nil {
		o.model[tenant] = map[string]struct {
			state store.KeyState
			pub   ed25519.PublicKey
		}{}
	}
	o.model[tenant][keyID] = struct {
		state store.KeyState
		pub   ed25519.PublicKey
	}{store.KeyActive, pub}
}

func (o *keyOps) set(tenant, keyID string, state store.KeyState) {
	o.each(string(state)+" "+keyID, func(s *store.Store) error {
		if state == store.KeyRetired {
			return s.Credentials().RetireKey(context.Background(), tenant, keyID)
		}
		return s.Credentials().RevokeKey(context.Background(), tenant, keyID)
	})
	k := o.model[tenant][keyID]
	k.state = state
	o.model[tenant][keyID] = k
}

// prune deletes every retired and revoked key: a replay window of a
// microsecond leaves every envelope the keys signed outside it.
func (o *keyOps) prune() {
	o.each("prune", func(s *store.Store) error {
		_, err := s.Credentials().PruneKeys(context.Background(), time.Microsecond)
		return err
	})
	for _, keys := range o.model {
		for id, k := range keys {
			if k.state != store.KeyActive {
				delete(keys, id)
			}
		}
	}
}

// verifiedKeyIDs are the key ids the workload names with VerifiedWith set.
var verifiedKeyIDs = []string{"k-act", "k-ret", "k-rev", "k-gone", "k-new", "k-roll"}

// TestIngestBatchMatchesOneByOneVerifiedWith is TestIngestBatchMatchesOneByOne
// with the key check of IngestInput.VerifiedWith in the workload: inputs name
// keys that are active, retired, revoked, pruned, or active again under the
// same id with another public key, and a rolling key changes state between
// rounds. Both paths must give the same answers (cursor included) and leave
// the same rows, and an input is stale exactly when its key is not active
// with the public key it names.
func TestIngestBatchMatchesOneByOneVerifiedWith(t *testing.T) {
	byClass := map[keyClass]map[string]int{}
	for seed := uint64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewPCG(seed, 17))
		batched, single := newFixture(t), newFixture(t)
		ops := &keyOps{t: t, fs: []*fixture{batched, single}, model: keyModel{}}
		pubA, pubB := map[string]ed25519.PublicKey{}, map[string]ed25519.PublicKey{}
		for _, tenant := range []string{"t1", "t2"} {
			pubA[tenant], pubB[tenant] = newKey(t), newKey(t)
			// k-gone is pruned; k-new is pruned and added again with another public key.
			ops.add(tenant, "k-gone", pubA[tenant])
			ops.add(tenant, "k-new", pubA[tenant])
			ops.set(tenant, "k-gone", store.KeyRevoked)
			ops.set(tenant, "k-new", store.KeyRetired)
		}
		ops.prune()
		for _, tenant := range []string{"t1", "t2"} {
			ops.add(tenant, "k-new", pubB[tenant])
			for _, id := range []string{"k-act", "k-ret", "k-rev", "k-roll"} {
				ops.add(tenant, id, pubA[tenant])
			}
			ops.set(tenant, "k-ret", store.KeyRetired)
			ops.set(tenant, "k-rev", store.KeyRevoked)
		}

		for round := 0; round < 4; round++ {
			// k-roll: active, then retired, revoked, and finally pruned and
			// added again with the other public key (k-ret and k-rev, pruned
			// with it, come back in their states).
			for _, tenant := range []string{"t1", "t2"} {
				switch round {
				case 1:
					ops.set(tenant, "k-roll", store.KeyRetired)
				case 2:
					ops.set(tenant, "k-roll", store.KeyRevoked)
				}
			}
			if round == 3 {
				ops.prune()
				for _, tenant := range []string{"t1", "t2"} {
					ops.add(tenant, "k-roll", pubB[tenant])
					ops.add(tenant, "k-ret", pubA[tenant])
					ops.add(tenant, "k-rev", pubA[tenant])
					ops.set(tenant, "k-ret", store.KeyRetired)
					ops.set(tenant, "k-rev", store.KeyRevoked)
				}
			}
			label := fmt.Sprintf("seed %d round %d", seed, round)
			if round > 0 && r.IntN(2) == 0 {
				raiseFloorBoth(t, label, r, batched, single)
			}

			items := randomItems(r, 2+r.IntN(79))
			// Resent items share their input with the original, so a resend
			// names the same key as what it resends.
			for _, it := range items {
				if it.Ingest == nil || r.IntN(5) < 2 {
					continue
				}
				it.Ingest.KeyID = verifiedKeyIDs[r.IntN(len(verifiedKeyIDs))]
				it.Ingest.VerifiedWith = pubA[it.Actor.TenantID]
				if r.IntN(3) == 0 {
					it.Ingest.VerifiedWith = pubB[it.Actor.TenantID]
				}
			}

			got := ingestBoth(t, label, batched, single, items)
			for i, it := range items {
				if it.Ingest == nil {
					continue
				}
				c := ops.model.class(it.Actor.TenantID, it.Ingest)
				shouldBeStale := c != keyUnchecked && c != keyActive
				if (got[i].Outcome == store.OutcomeStale) != shouldBeStale {
					t.Fatalf("%s item %d: key %s answered %+v", label, i, c, got[i])
				}
				if byClass[c] == nil {
					byClass[c] = map[string]int{}
				}
				byClass[c][string(got[i].Outcome)+"/"+got[i].Reason]++
			}
			keysOf := func(f *fixture) string {
				var s string
				if err := f.admin.QueryRow(`SELECT coalesce(string_agg(format('%s:%s:%s', tenant_id, sequence, key_id), ',' ORDER BY tenant_id, producer_id, sequence), '') FROM event_identities`).Scan(&s); err != nil {
					t.Fatal(err)
				}
				return s
			}
			if b, s := keysOf(batched), keysOf(single); b != s {
				t.Fatalf("%s: stored key ids differ\nbatch  %s\nsingle %s", label, b, s)
			}
		}
	}
	// Every way of being stale, and being decided with a checked key, must
	// have been compared, or the test proves little.
	for _, c := range []keyClass{keyRetired, keyRevoked, keyPruned, keyReplaced} {
		if byClass[c]["stale/"] == 0 {
			t.Errorf("no %s key was compared: %v", c, byClass)
		}
	}
	for _, c := range []keyClass{keyActive, keyUnchecked} {
		if byClass[c]["accepted/"] == 0 || byClass[c]["duplicate/"] == 0 {
			t.Errorf("%s keys never reached both accepted and duplicate: %v", c, byClass[c])
		}
	}
	t.Logf("verdicts compared by key: %v", byClass)
}

// raiseFloorBoth raises one random stream's replay floor in both fixtures
// (or fails alike in both: a lower floor, a stream never written).
func raiseFloorBoth(t *testing.T, label string, r *rand.Rand, batched, single *fixture) {
	t.Helper()
	tenant, producer, floor := []string{"t1", "t2"}[r.IntN(2)], fmt.Sprintf("d%d", 1+r.IntN(3)), int64(r.IntN(6))
	for _, f := range []*fixture{batched, single} {
		if _, err := f.s.Inbound().SetReplayFloor(context.Background(), tenant, "p1", producer, floor); err != nil && !errors.Is(err, store.ErrConflict) && !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: SetReplayFloor: %v", label, err)
		}
	}
}

// ingestBoth is the comparison of the two paths of step 5: items go to
// batched as one IngestBatch (set-based) and to single one by one (decideSQL,
// refusals as Audit), and every answer and the rows left must be the same.
// It returns the answers.
func ingestBoth(t *testing.T, label string, batched, single *fixture, items []store.BatchItem) []store.Result {
	t.Helper()
	ctx := context.Background()
	got, err := batched.s.Inbound().IngestBatch(ctx, items)
	if err != nil {
		t.Fatalf("%s: IngestBatch: %v", label, err)
	}
	if len(got) != len(items) {
		t.Fatalf("%s: %d results for %d items", label, len(got), len(items))
	}
	for i, it := range items {
		var want store.Result
		if it.Refusal != nil {
			if err := single.s.Inbound().Audit(ctx, it.Actor, *it.Refusal); err != nil {
				t.Fatal(err)
			}
			want = store.Result{Outcome: store.Outcome(it.Refusal.Outcome), Reason: it.Refusal.Reason}
		} else {
			want = mustIngest(t, single.s, it.Actor, *it.Ingest)
		}
		if got[i] != want {
			key := "-"
			if it.Ingest != nil {
				key = fmt.Sprintf("%s, verified with %x", it.Ingest.KeyID, it.Ingest.VerifiedWith)
			}
			t.Fatalf("%s item %d (key %s): batch %+v, one by one %+v", label, i, key, got[i], want)
		}
	}
	if b, s := batched.snapshot(), single.snapshot(); b != s {
		t.Fatalf("%s: state differs\nbatch  %+v\nsingle %+v", label, b, s)
	}
	return got
}
