package janitor

import (
	"testing"

	"go.uber.org/goleak"
)

// Every run closes its lock connection, pool and push client.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
