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
// at most perTenant of them for any one tenant. Only the scheduler takes
// slots; every attempt gives its own back when it ends, whatever way it
// ends, and wakes the scheduler.
//
// A tenant's share is held from the claim until the endpoint has answered
// (or the request failed or was cut off): that is the part a slow endpoint
// stretches. The worker's slot is held on until the outcome is settled,
// which takes a group commit shared by every tenant and is the same for
// all of them. Holding the share through the settle too made one tenant
// alone against a fast endpoint lose 30-50% of its throughput (bench: the
// share's slots waited on commits, not on the endpoint); a tenant still
// never has more than its share of requests outstanding.
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
// tenant is claimed as before.
type slots struct {
	total, perTenant, refill int

	mu       sync.Mutex
	inUse    int            // the worker's slots: claim to settle
	byTenant map[string]int // each tenant's share: claim to answer
	freed    chan struct{}  // capacity 1: "a slot came free since you last looked"
}

func newSlots(total, perTenant, claimMax int) *slots {
	return &slots{total: total, perTenant: perTenant, refill: max(1, min(perTenant, claimMax)/2),
		byTenant: map[string]int{}, freed: make(chan struct{}, 1)}
}

// take reserves up to want slots for tenant. It returns 0 at once when the
// tenant is full; otherwise it waits until at least one of the worker's
// slots is free (or ctx ends: 0) and takes as many as both limits allow.
func (s *slots) take(ctx context.Context, tenant string, want int) int {
	for {
		s.mu.Lock()
		room := s.perTenant - s.byTenant[tenant]
		if s.fullLocked(tenant) {
			s.mu.Unlock()
			return 0
		}
		if n := min(want, room, s.total-s.inUse); n > 0 {
			s.inUse += n
			s.byTenant[tenant] += n
			s.mu.Unlock()
			return n
		}
		s.mu.Unlock()
		select {
		case <-s.freed:
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
	s.give(tenant, n, n)
}

// give gives back share slots of tenant's share and total of the
// worker's, and wakes the scheduler.
func (s *slots) give(tenant string, share, total int) {
	if share <= 0 && total <= 0 {
		return
	}
	s.mu.Lock()
	s.inUse -= total
	if left := s.byTenant[tenant] - share; left > 0 {
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
// once the endpoint's answer is in, which gives back the tenant's share;
// the worker's slot, and the share if answered was not called, come back
// however fn ends (it returns, its context is cancelled, it panics).
func (s *slots) run(tenant string, fn func(answered func())) {
	shared := true
	answered := func() {
		if shared {
			shared = false
			s.give(tenant, 1, 0)
		}
	}
	defer func() {
		if shared {
			s.give(tenant, 1, 1)
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

// held reports the slots in use in all and by tenant (tests, and the
// scheduler's view in one lock).
func (s *slots) held(tenant string) (all, ofTenant int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse, s.byTenant[tenant]
}
