package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops its relays and closes its clients; nothing may keep
// running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
