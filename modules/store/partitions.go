package store

// The partitioned layout (migrations/layout.go) hash-partitions the large
// tables by tenant_id. Every statement that names a tenant reaches one
// partition through the parent; the janitor's deletes by ctid cannot, since
// a ctid names a row only within one heap: they run partition by partition
// on the partitions themselves. The layout never changes once migrated, so
// what the catalog says is read once per Store.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// partitionGroup maps each of a statement's tables to its partition holding
// one hash bound (the same tenants in every table, colocated by the
// layout's one modulus), as quoted identifiers.
type partitionGroup map[string]string

type partitionCache struct {
	mu   sync.Mutex
	sets map[string][]partitionGroup // by the tables asked for; nil: plain
	next uint32                      // where the next sweep starts, so no partition always goes last
}

const partitionsSQL = `
SELECT p.relname, p.relkind::text, c.relname, c.relkind::text, coalesce(pg_get_expr(c.relpartbound, c.oid), '')
FROM pg_class p
LEFT JOIN pg_inherits i ON i.inhparent = p.oid
LEFT JOIN pg_class c ON c.oid = i.inhrelid
WHERE p.oid = ANY ($1::regclass[])`

// partitions returns nil when every table is one plain heap, and otherwise
// one group per hash bound, every table present in each.
func (s *Retention) partitions(ctx context.Context, tables ...string) ([]partitionGroup, error) {
	key := strings.Join(tables, ",")
	s.parts.mu.Lock()
	defer s.parts.mu.Unlock()
	if g, ok := s.parts.sets[key]; ok {
		return g, nil
	}
	rows, err := s.sqlDB().QueryContext(ctx, partitionsSQL, tables)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	byBound := map[string]partitionGroup{}
	kinds := map[string]string{}
	for rows.Next() {
		var parent, pkind string
		var child, ckind *string
		var bound string
		if err := rows.Scan(&parent, &pkind, &child, &ckind, &bound); err != nil {
			return nil, err
		}
		kinds[parent] = pkind
		if child == nil {
			continue
		}
		if pkind != "p" || *ckind != "r" || bound == "" {
			return nil, fmt.Errorf("%w: %s has %s", errLayoutUnsupported, parent, *child)
		}
		if byBound[bound] == nil {
			byBound[bound] = partitionGroup{}
		}
		byBound[bound][parent] = pgx.Identifier{*child}.Sanitize()
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var groups []partitionGroup
	if len(byBound) > 0 {
		bounds := make([]string, 0, len(byBound))
		for b := range byBound {
			bounds = append(bounds, b)
		}
		slices.Sort(bounds)
		for _, b := range bounds {
			if len(byBound[b]) != len(tables) {
				return nil, fmt.Errorf("%w: %v are not partitioned alike (bound %s)", errLayoutUnsupported, tables, b)
			}
			groups = append(groups, byBound[b])
		}
	}
	for _, t := range tables {
		if k := kinds[t]; (k != "r" || groups != nil) && (k != "p" || groups == nil) {
			return nil, fmt.Errorf("%w: %v", errLayoutUnsupported, tables)
		}
	}
	if s.parts.sets == nil {
		s.parts.sets = map[string][]partitionGroup{}
	}
	s.parts.sets[key] = groups
	return groups, nil
}

// sweepOrder is the groups in the order one sweep visits them.
func (s *Retention) sweepOrder(groups []partitionGroup) []partitionGroup {
	s.parts.mu.Lock()
	start := int(s.parts.next % uint32(len(groups)))
	s.parts.next++
	s.parts.mu.Unlock()
	return append(slices.Clone(groups[start:]), groups[:start]...)
}
