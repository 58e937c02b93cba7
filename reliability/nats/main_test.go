// Package natsreliability_test holds the NATS JetStream crash campaign:
// consumer processes of one durable pull consumer, running the
// transactional inbox on PostgreSQL, killed with SIGKILL at random and
// restarted while events arrive, some twice and some poison. It ends by
// counting effects and dead letters. See RELIABILITY.md.
package natsreliability_test

import (
	"testing"

	"github.com/dedupkit/dedup/internal/crashtest"
)

// TestMain runs the test binary as a campaign worker process when the
// worker environment variable is set (see worker_test.go), and as the test
// suite otherwise.
func TestMain(m *testing.M) { crashtest.Main(m, workerEnv, workerMain) }
