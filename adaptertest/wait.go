package adaptertest

import (
	"context"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
)

// WaitFor polls cond until it holds, and fails t (naming what it waited
// for) unless it does within timeout. A test waits on an effect this way,
// never on a fixed sleep.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitFinal waits until the record of key in store is FAILED_FINAL and
// returns it. A consumer dead-letters an event before it records the event
// as failed for good, so a test that has seen the letter waits for the
// record rather than reading it at once.
func WaitFinal(t testing.TB, store dedup.Store, key dedup.Key) dedup.Record {
	t.Helper()
	var rec dedup.Record
	WaitFor(t, Deadline, "the record of "+key.String()+" FAILED_FINAL", func() bool {
		var err error
		rec, err = store.Get(context.Background(), key)
		return err == nil && rec.Status == dedup.StatusFailedFinal
	})
	return rec
}
