package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops its relays and closes its clients; nothing may keep
// running but the idle keep-alive connections of the SQS clients' shared
// HTTP transport.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"))
}
