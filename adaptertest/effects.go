package adaptertest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/dedupkit/dedup"
)

// Effects records what a test's handler did and what the wrapper decided:
// per event ID, the handler's calls and its business effects, and the
// results its observer saw (pass Observe to dedup.WithObserver). It is safe
// for concurrent use.
type Effects struct {
	mu      sync.Mutex
	effects map[string]int
	calls   map[string]int
	order   []string // the calls' IDs, in order
	results []dedup.Result
}

// NewEffects returns an empty Effects.
func NewEffects() *Effects {
	return &Effects{effects: make(map[string]int), calls: make(map[string]int)}
}

// Call records a handler call for id and returns how many there have been,
// this one included.
func (e *Effects) Call(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls[id]++
	e.order = append(e.order, id)
	return e.calls[id]
}

// Apply records one business effect of id.
func (e *Effects) Apply(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.effects[id]++
}

// Observe records a result; it is a dedup.WithObserver function.
func (e *Effects) Observe(_ context.Context, res dedup.Result) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.results = append(e.results, res)
}

// Count returns how many effects id had.
func (e *Effects) Count(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.effects[id]
}

// Calls returns how many handler calls id had.
func (e *Effects) Calls(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[id]
}

// CallCount returns how many handler calls there were in all.
func (e *Effects) CallCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.order)
}

// CallOrder returns the IDs of the handler calls, in order.
func (e *Effects) CallOrder() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.order)
}

// Applied returns how many distinct events had at least one effect.
func (e *Effects) Applied() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.effects)
}

// Counts returns a copy of the effects per event ID.
func (e *Effects) Counts() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]int, len(e.effects))
	for k, v := range e.effects {
		out[k] = v
	}
	return out
}

// Twice returns the IDs applied more than once, as "id×n".
func (e *Effects) Twice() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for id, n := range e.effects {
		if n > 1 {
			out = append(out, fmt.Sprintf("%s×%d", id, n))
		}
	}
	slices.Sort(out)
	return out
}

// Results returns how many results were observed.
func (e *Effects) Results() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.results)
}

// Outcomes returns how many observed results had outcome o.
func (e *Effects) Outcomes(o dedup.Outcome) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range e.results {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

// Settled returns how many observed results for id let the transport
// acknowledge the delivery (dedup.Result.Settled).
func (e *Effects) Settled(id string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range e.results {
		if r.Key.EventID == id && r.Settled() {
			n++
		}
	}
	return n
}

// AssertOnce fails t unless each of ids had exactly one effect and no other
// event had any.
func (e *Effects) AssertOnce(t testing.TB, ids []string) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range ids {
		if n := e.effects[id]; n != 1 {
			t.Errorf("%s: %d effects, want 1", id, n)
		}
	}
	if len(e.effects) != len(ids) {
		t.Errorf("%d events had an effect, want %d", len(e.effects), len(ids))
	}
}
