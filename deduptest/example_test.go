package deduptest_test

import (
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
)

// A store's own test runs the whole conformance suite against it; here the
// memory store. In a store package, this is a Test function:
//
//	func TestConformance(t *testing.T) { deduptest.Run(t, mystore.New(client)) }
func ExampleRun() {
	conformance := func(t *testing.T) { deduptest.Run(t, dedup.NewMemoryStore()) }
	_ = conformance
}
