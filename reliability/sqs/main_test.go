// Package sqsreliability_test holds the SQS side of the campaigns that try to
// break the SDK's promise under fire: consumer processes of one queue killed
// at random and restarted, the DynamoDB store and the dead-letter queue
// going away mid-run, and every kind of bad input the SQS adapter can meet.
// Each ends by counting effects and dead letters. See README.md.
package sqsreliability_test

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs the test binary as a campaign worker process when the
// worker environment variable is set (see worker_test.go), and as the test
// suite otherwise.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(workerEnv); cfg != "" {
		os.Exit(workerMain(cfg))
	}
	// The bad-input cases spend their time waiting for visibility timeouts,
	// not on the CPU: unless -test.parallel says otherwise, run more of them
	// at once than the default of one per CPU.
	flag.Parse()
	parallel := false
	flag.Visit(func(f *flag.Flag) { parallel = parallel || f.Name == "test.parallel" })
	if !parallel {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(m.Run())
}
