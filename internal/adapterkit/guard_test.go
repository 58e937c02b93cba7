package adapterkit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// stats has the fields of dedup.Stats, as a Wrapper's Stats type does.
type stats struct {
	LastSuccess  time.Time
	LastFailure  time.Time
	LastError    error
	FailingSince time.Time
}

// wrapper is a Wrapper in an outage since since.
type wrapper struct{ since time.Time }

func (w wrapper) Health() error {
	return errors.Join(deduptype.ErrOutage, errStore)
}

func (w wrapper) Stats() stats { return stats{FailingSince: w.since, LastError: errStore} }

// An outage longer than the bound gives up: Ctx is done and End returns
// ErrOutage before the shutdown's error; the caller's cancel gives up
// with nothing.
func TestGuardGivesUpOnAnOutage(t *testing.T) {
	g := NewGuard(context.Background(), wrapper{since: time.Now().Add(-time.Hour)}, time.Minute)
	p := g.NewPolicy(time.Second, nil)
	if d := p.Batch(nil).Decide(deduptype.Result{}, errStore); d.Action != Lapse {
		t.Errorf("failure: %+v, want Lapse", d)
	}
	if g.Ctx.Err() == nil || !errors.Is(context.Cause(g.Ctx), deduptype.ErrOutage) {
		t.Fatalf("Ctx: %v (cause %v), want done with ErrOutage", g.Ctx.Err(), context.Cause(g.Ctx))
	}
	errShutdown := errors.New("final commit failed")
	if err := g.End(errShutdown); !errors.Is(err, deduptype.ErrOutage) || !errors.Is(err, errShutdown) {
		t.Errorf("End: %v, want ErrOutage and the shutdown's error", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	g = NewGuard(ctx, wrapper{since: time.Now()}, time.Hour)
	g.NewPolicy(time.Second, nil).Batch(nil).Decide(deduptype.Result{}, errStore)
	cancel()
	<-g.Ctx.Done()
	if err := g.End(nil); err != nil {
		t.Errorf("End after the caller's cancel, within the bound: %v, want nil", err)
	}
}
