package kafkadedup_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes its clients and cluster; nothing may keep running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
