// Package backoff holds the module's one exponential backoff with jitter:
// dedup.ExponentialBackoff is it, and the transport adapters' defaults
// (adapterkit.FailureBackoff) are made with it. Like every internal package
// it does not import the root package.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential returns a backoff that doubles the wait from base with each
// attempt, up to max, and picks uniformly in the upper half of that so
// that consumers retrying together spread out: attempt n waits in
// [d/2, d) with d = min(base·2^(n-1), max).
func Exponential(base, max time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := base
		for i := 1; i < attempt && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		if d <= 1 {
			return d
		}
		return d/2 + rand.N(d/2)
	}
}
