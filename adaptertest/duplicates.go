package adaptertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
)

// Copies of each of a few events, published together and taken by several
// consumers at once, have one effect per event, and every copy is
// acknowledged: the first as processed, the others as duplicates.
func testDuplicates(t *testing.T, f Features, h Harness) {
	const events, copies = 5, 6
	consumers := 3
	if f.SingleConsumer {
		consumers = 1
	}
	var msgs []Message
	var ids []string
	for i := range events {
		ids = append(ids, fmt.Sprintf("dup-%02d", i))
	}
	for range copies {
		for _, id := range ids {
			msgs = append(msgs, Message{ID: id, Payload: fmt.Appendf(nil, `{"event":%q}`, id)})
		}
	}
	h.Publish(t, msgs...)

	store, scope, fx := dedup.NewMemoryStore(), newScope(t), NewEffects()
	cfg := config(t, store, scope, fx, applying(fx, 10*time.Millisecond))
	var runs []*Running
	for range consumers {
		runs = append(runs, Start(t, h.NewConsumer(t, cfg).Run))
	}
	WaitFor(t, Deadline, fmt.Sprintf("each of %d copies of %d events settled", copies, events), func() bool {
		for _, id := range ids {
			if fx.Settled(id) < copies {
				return false
			}
		}
		return true
	})
	for _, r := range runs {
		r.StopClean(t)
	}
	waitSettled(t, h)
	fx.AssertOnce(t, ids)
	assertRecords(t, store, scope, ids, dedup.StatusSucceeded)
	if n := fx.Outcomes(dedup.OutcomeDuplicate); n < events*(copies-1) {
		t.Errorf("%d deliveries answered as duplicates, want at least %d", n, events*(copies-1))
	}
	t.Logf("%d consumers: %d handler calls, %d results (%d in flight elsewhere)",
		consumers, fx.CallCount(), fx.Results(), fx.Outcomes(dedup.OutcomeInFlight))
}
