package adapterkit

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// acted is what act was called with for one delivery.
type acted struct {
	i int
	d Decision
}

// InOrder calls act once for each delivery, in order: those run with their
// decision, those behind the first not settled with NotRun.
func TestInOrderGivesBackThoseBehindTheFirstNotSettled(t *testing.T) {
	var gave []error
	b := policy(true, nil, 0, time.Time{}, &gave).Batch(nil)
	results := []deduptype.Result{{Outcome: deduptype.OutcomeProcessed}, {Outcome: deduptype.OutcomeRetry}}
	var got []acted
	InOrder(b, make([]int, 4), func(ms []int, yield func(int, deduptype.Result, error) bool) error {
		for i, res := range results {
			if !yield(i, res, nil) {
				break
			}
		}
		return nil
	}, func(i int, _ deduptype.Result, d Decision) { got = append(got, acted{i, d}) })
	want := []acted{{0, Decision{Action: Ack}}, {1, Decision{Action: Redeliver}}, {2, NotRun()}, {3, NotRun()}}
	if !slices.Equal(got, want) {
		t.Errorf("acted %+v, want %+v", got, want)
	}
}

// When the batch claim fails, none ran: each delivery gets the claim's
// error, counted once.
func TestInOrderClaimFailed(t *testing.T) {
	var gave []error
	b := policy(true, nil, 0, time.Time{}, &gave).Batch(nil)
	var got []acted
	InOrder(b, make([]int, 3), func([]int, func(int, deduptype.Result, error) bool) error { return errStore },
		func(i int, _ deduptype.Result, d Decision) { got = append(got, acted{i, d}) })
	if len(got) != 3 {
		t.Fatalf("acted %+v, want each of 3 deliveries", got)
	}
	for k, a := range got {
		if a.i != k || !errors.Is(a.d.Err, errStore) || a.d.Failures != 1 || a.d.Settled() {
			t.Errorf("delivery %d: %+v, want the claim's error, the 1st failure in a row", k, a)
		}
	}
}

// Once Run is stopping, neither InOrder nor Concurrent runs a batch: each
// delivery is given back at once.
func TestStoppingRunsNone(t *testing.T) {
	var gave []error
	stop := make(chan struct{})
	close(stop)
	p := policy(true, nil, 0, time.Time{}, &gave)
	ran := false
	var got []acted
	record := func(i int, _ deduptype.Result, d Decision) { got = append(got, acted{i, d}) }
	InOrder(p.Batch(stop), make([]int, 2), func([]int, func(int, deduptype.Result, error) bool) error {
		ran = true
		return nil
	}, record)
	Concurrent(p.Batch(stop), make([]int, 2), func([]int, func(int, deduptype.Result, error)) error {
		ran = true
		return nil
	}, record)
	want := []acted{{0, NotRun()}, {1, NotRun()}, {0, NotRun()}, {1, NotRun()}}
	if ran || !slices.Equal(got, want) {
		t.Errorf("ran: %v, acted %+v; want none run, acted %+v", ran, got, want)
	}
}
