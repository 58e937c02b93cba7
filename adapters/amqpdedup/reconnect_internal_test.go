package amqpdedup

import (
	"testing"
	"time"
)

// The reconnect delay is 250 to 500 ms after the first failure, then 0.5
// to 1 s however long the broker stays away: never the handlers' error
// backoff, which grows to 30 s.
func TestReconnectDelay(t *testing.T) {
	for failures := 1; failures <= 100; failures++ {
		lo, hi := 500*time.Millisecond, time.Second
		if failures == 1 {
			lo, hi = 250*time.Millisecond, 500*time.Millisecond
		}
		for range 50 {
			if d := reconnectDelay(failures); d < lo || d > hi {
				t.Fatalf("reconnectDelay(%d) = %v, want %v to %v", failures, d, lo, hi)
			}
		}
	}
}
