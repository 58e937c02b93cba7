package backoff

import (
	"testing"
	"time"
)

// Each attempt waits in the upper half of base doubled attempt-1 times,
// capped at max.
func TestExponential(t *testing.T) {
	b := Exponential(time.Second, 15*time.Second)
	for _, c := range []struct {
		attempt int
		d       time.Duration
	}{{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {4, 8 * time.Second}, {5, 15 * time.Second}, {100, 15 * time.Second}} {
		for range 50 {
			if got := b(c.attempt); got < c.d/2 || got >= c.d {
				t.Fatalf("attempt %d: %v, want in [%v, %v)", c.attempt, got, c.d/2, c.d)
			}
		}
	}
	if got := Exponential(0, time.Second)(3); got != 0 {
		t.Errorf("zero base: %v, want 0", got)
	}
}
