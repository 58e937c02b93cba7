// Package lambdastreamreliability_test holds the crash campaign of the
// Lambda handler for Kinesis: worker processes run the handler under
// aws-lambda-go's own runtime loop (lambda.Start) against a Runtime API the
// test serves, which plays the Lambda service with stream semantics (one
// invocation per shard at a time, a checkpoint moved by the partial batch
// response, a batch bisected after a function error). Workers run the
// transactional inbox on PostgreSQL and park poison records in an SQS queue;
// they are killed with SIGKILL mid-batch and restarted. It ends by counting
// effects and dead letters. See RELIABILITY.md.
package lambdastreamreliability_test

import (
	"testing"

	"github.com/dedupkit/dedup/internal/crashtest"
)

// TestMain runs the test binary as a campaign worker process when the
// worker environment variable is set (see worker_test.go), and as the test
// suite otherwise.
func TestMain(m *testing.M) { crashtest.Main(m, workerEnv, workerMain) }
