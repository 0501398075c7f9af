package envctl

import (
	"context"
	"database/sql"
)

// InvariantCount is one invariant of `envctl verify` and how many rows break it.
type InvariantCount struct {
	Name  string
	Why   string
	Count int64
}

// CheckInvariants runs every `envctl verify` invariant on db (as the database owner) in one
// read-only REPEATABLE READ snapshot, for other tools that hold a database to the same rules (the
// chaos run's checker).
func CheckInvariants(ctx context.Context, db *sql.DB) ([]InvariantCount, error) {
	res, err := checkInvariants(ctx, db)
	if err != nil {
		return nil, err
	}
	why := map[string]string{}
	for _, inv := range invariants() {
		why[inv.name] = inv.why
	}
	out := make([]InvariantCount, len(res))
	for i, r := range res {
		out[i] = InvariantCount{Name: r.name, Why: why[r.name], Count: r.count}
	}
	return out, nil
}
