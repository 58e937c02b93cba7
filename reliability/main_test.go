// Package reliability_test holds the campaigns that try to break the SDK's
// promise under fire: consumer processes killed at random, a store or the
// dead-letter topic going away mid-run, and every kind of bad input. Each
// ends by counting effects: every event's effect exactly once, every poison
// event dead-lettered, nothing lost. See RELIABILITY.md at the module root.
package reliability_test

import (
	"testing"

	"github.com/dedupkit/dedup/internal/crashtest"
)

// TestMain runs the test binary as a campaign worker process when the
// worker environment variable is set (see worker_test.go), and as the test
// suite otherwise.
func TestMain(m *testing.M) { crashtest.Main(m, workerEnv, workerMain) }
