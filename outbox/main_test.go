package outbox_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain runs the test binary as a relay process of the end-to-end
// campaign when the worker environment variable is set (see
// relayworker_test.go), and as the test suite otherwise. Every test stops its
// relays and closes its clients: nothing may keep running but the idle
// keep-alive connections of the SQS clients' shared HTTP transport.
func TestMain(m *testing.M) {
	if cfg := os.Getenv(relayWorkerEnv); cfg != "" {
		os.Exit(relayWorkerMain(cfg))
	}
	code := m.Run()
	dropExampleSchema()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
