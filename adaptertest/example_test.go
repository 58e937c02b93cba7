package adaptertest_test

import (
	"testing"

	"github.com/dedupkit/dedup/adaptertest"
)

// An adapter's test runs the whole suite against its broker through a
// Harness of its own, saying what the broker lacks (each adapter's
// conformance_test.go is one):
//
//	func TestConformance(t *testing.T) {
//		adaptertest.Run(t, adaptertest.Features{NoConnectionLoss: true}, newHarness)
//	}
func ExampleRun() {
	conformance := func(t *testing.T, newHarness func(*testing.T) adaptertest.Harness) {
		adaptertest.Run(t, adaptertest.Features{NoConnectionLoss: true}, newHarness)
	}
	_ = conformance
}
