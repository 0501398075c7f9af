package worker

import (
	"context"
	"sync"
	"time"
)

// DefaultTenantMaxInflight is a tenant's share of a worker's attempt slots
// when DELIVERY_TENANT_MAX_INFLIGHT is not set (contract §8.7): a quarter of
// concurrency, at least 1. Four tenants whose endpoints hang can fill a
// worker; one cannot.
func DefaultTenantMaxInflight(concurrency int) int { return max(1, concurrency/4) }

// slots accounts for the attempts a worker runs: at most total at once, and
// at most perTenant of them for any one tenant, from the claim until the
// endpoint has answered (or the request failed or was cut off), the part a
// slow endpoint stretches. An answered attempt then waits for its settle,
// a group commit shared by every tenant (see settler), outside both: as a
// River job's slot frees when the job returns, not when its completion is
// written, the next claim does not wait for the commit. What waits for a
// settle is bounded on its own: no claim while settleMax (the total again)
// answers wait, so at most twice the total (those plus the requests out when
// the bound was reached), and a database that settles more slowly than
// endpoints answer stops the claims instead of letting leased messages pile
// up in this process. Holding the share through the settle made one tenant
// alone against a fast endpoint lose 30-50% of its throughput, and holding
// the worker's slot through it left claims waiting on commits
// (bench-delivery.sh: a third of both cores idle while the backlog
// drained).
//
// Only the scheduler takes slots; every attempt gives its own back when it
// ends, whatever way it ends, and wakes the scheduler.
//
// A slot is taken before the claim, for exactly the messages the claim may
// return, so a claimed message always has a slot to start in at once:
// nothing leased waits in this process for a tenant's earlier attempts, and
// a tenant over its share is not claimed at all (its backlog stays
// claimable by other replicas).
//
// A tenant with attempts running is claimed again only once at least
// refill of its share is free (half a full claim). Otherwise a busy tenant
// against a fast endpoint would be claimed again as each attempt ends, one
// or two messages per claim, and a claim costs about the same for 1 row as
// for 50: the first bench run of the share lost half its throughput so.
// Lightly loaded tenants are not delayed: below its share less refill a
// tenant is claimed as before. The worker's slots have the same rule
// (totalRefill).
type slots struct {
	total, perTenant, refill int
	totalRefill              int           // the worker's slots a claim waits for while attempts run
	refillWait               time.Duration // for at most this long (refillWait); tests lengthen it

	mu        sync.Mutex
	inUse     int            // the worker's slots: claim to answer
	byTenant  map[string]int // each tenant's share: claim to answer
	settling  int            // answered attempts not yet settled
	settleMax int
	freed     chan struct{} // capacity 1: "a slot came free since you last looked"
}

func newSlots(total, perTenant, claimMax int) *slots {
	return &slots{total: total, perTenant: perTenant, refill: max(1, min(perTenant, claimMax)/2),
		totalRefill: max(1, min(total, claimMax)/2), refillWait: refillWait, settleMax: total,
		byTenant: map[string]int{}, freed: make(chan struct{}, 1)}
}

// refillWait bounds how long a claim waits for totalRefill free slots
// before it takes what is free: slots held by requests to endpoints that
// hang come back only at the HTTP timeout, and the scheduler waiting in
// take serves no tenant meanwhile (§8.7: the other slots keep serving
// everyone else). A pipeline that is merely busy frees half a claim in
// less than that (one slot an answer, hundreds of answers a second).
const refillWait = 10 * time.Millisecond

// take reserves up to want slots for tenant. It returns 0 at once when the
// tenant is full; otherwise it waits until enough of the worker's slots are
// free (or ctx ends: 0) and takes as many as both limits allow. Enough is
// one while the worker is idle, and totalRefill (half a full claim) or what
// the claim may take, if less, while attempts run, for at most refillWait
// and then one again: for the same reason as refill, a worker whose slots
// come back one answer at a time would otherwise claim one or two messages
// at a time.
func (s *slots) take(ctx context.Context, tenant string, want int) int {
	var patience <-chan time.Time // set at the first wait for a refill
	patient := true
	for {
		s.mu.Lock()
		room := s.perTenant - s.byTenant[tenant]
		if s.fullLocked(tenant) {
			s.mu.Unlock()
			return 0
		}
		free := s.total - s.inUse
		if s.settling >= s.settleMax {
			free = 0
		}
		n := min(want, room, free)
		refilled := s.inUse == 0 || free >= min(want, room, s.totalRefill) || !patient
		if n > 0 && refilled {
			s.inUse += n
			s.byTenant[tenant] += n
			s.mu.Unlock()
			return n
		}
		if n > 0 && patience == nil {
			t := time.NewTimer(s.refillWait)
			defer t.Stop()
			patience = t.C
		}
		s.mu.Unlock()
		select {
		case <-s.freed:
		case <-patience:
			patient = false
		case <-ctx.Done():
			return 0
		}
	}
}

// full reports whether tenant is not to be claimed now: it holds its whole
// share, or it has attempts running and less than refill of its share free.
func (s *slots) full(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fullLocked(tenant)
}

func (s *slots) fullLocked(tenant string) bool {
	n := s.byTenant[tenant]
	return n >= s.perTenant || (n > 0 && s.perTenant-n < s.refill)
}

// release gives back n slots of tenant, share and worker slot alike.
func (s *slots) release(tenant string, n int) {
	s.give(tenant, n, 0)
}

// give gives back n of tenant's slots (share and worker slot) and settled
// of the settling count, and wakes the scheduler. An answered attempt
// gives its slot and starts settling (n = 1, settled = -1).
func (s *slots) give(tenant string, n, settled int) {
	if n <= 0 && settled == 0 {
		return
	}
	s.mu.Lock()
	s.inUse -= n
	s.settling -= settled
	if left := s.byTenant[tenant] - n; left > 0 {
		s.byTenant[tenant] = left
	} else {
		delete(s.byTenant, tenant) // the map holds only tenants with attempts running
	}
	s.mu.Unlock()
	select {
	case s.freed <- struct{}{}:
	default:
	}
}

// run runs one attempt of tenant in a slot taken for it. fn calls answered
// once the endpoint's answer is in, which gives the slot back and counts the
// attempt as settling until fn returns; the slot, if answered was not called,
// or the settling count comes back however fn ends (it returns, its context
// is cancelled, it panics).
func (s *slots) run(tenant string, fn func(answered func())) {
	sending := true
	answered := func() {
		if sending {
			sending = false
			s.give(tenant, 1, -1)
		}
	}
	defer func() {
		if sending {
			s.give(tenant, 1, 0)
		} else {
			s.give(tenant, 0, 1)
		}
	}()
	fn(answered)
}

// waitRoom waits until one of tenants may be claimed again (it is no longer
// full), d passes or ctx ends. Waking only then, not at every attempt's end,
// keeps a scheduler whose tenants are all full from going round (and
// listing due tenants) once per answer.
func (s *slots) waitRoom(ctx context.Context, tenants []string, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		for _, tenant := range tenants {
			if !s.fullLocked(tenant) {
				s.mu.Unlock()
				return
			}
		}
		s.mu.Unlock()
		select {
		case <-s.freed:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// sending reports the attempts whose requests are out: answers still to
// come.
func (s *slots) sending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse
}
