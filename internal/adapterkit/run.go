package adapterkit

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/dedupkit/dedup/internal/shutdown"
)

// Config is what a Run needs of its adapter's Consumer.
type Config struct {
	// Name begins the Run's log messages and errors ("sqsdedup: <queue URL>").
	Name string
	Log  *slog.Logger
	// ShutdownTimeout is how long Stop waits for handlers before it cancels
	// their context (WithShutdownTimeout).
	ShutdownTimeout time.Duration
	// MaxOutage is how long failures may last before Run gives up
	// (WithMaxOutage); 0: never.
	MaxOutage time.Duration
	// InFlightDelay and Backoff are the Policy's.
	InFlightDelay time.Duration
	Backoff       func(failures int) time.Duration
}

// Run is the skeleton of one Run of a Consumer that hands batches of
// deliveries to handlers: Start it, poll until Ctx is done, handing each
// batch to Dispatch, then Stop it.
type Run struct {
	// Guard holds Ctx, done once the caller's context is, or once the Run
	// gives up (GiveUp): poll until then.
	*Guard
	// Work is the handlers' context: it outlives Ctx until the shutdown
	// timeout, so that running handlers can finish.
	Work context.Context
	// BG is for the consumer's own calls (acknowledgements, heartbeat,
	// deletes) and its services, until Stop returns.
	BG context.Context

	// Policy decides the actions of the Run's deliveries, with one count of
	// failures in a row.
	Policy *Policy

	cfg        Config
	cancelWork context.CancelFunc
	stopBG     context.CancelFunc
	stopLog    func() bool
	handlers   sync.WaitGroup
	services   sync.WaitGroup
}

// Start returns a Run under ctx of deliveries going through w.
func Start[S Stats](ctx context.Context, w Wrapper[S], c Config) *Run {
	r := &Run{cfg: c, Guard: NewGuard(ctx, w, c.MaxOutage)}
	r.Work, r.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	r.BG, r.stopBG = context.WithCancel(context.WithoutCancel(ctx))
	r.Policy = r.NewPolicy(c.InFlightDelay, c.Backoff)
	r.stopLog = context.AfterFunc(r.Ctx, func() {
		c.Log.Info(c.Name + ": stopping: waiting for running handlers")
	})
	return r
}

// Batch starts the decisions of one batch of deliveries, stopping with the
// Run.
func (r *Run) Batch() *Batch { return r.Policy.Batch(r.Ctx.Done()) }

// Dispatch runs handle, the handling of a batch, in a goroutine of its own
// that Stop waits for.
func (r *Run) Dispatch(handle func()) { r.handlers.Go(handle) }

// Serve runs service (a heartbeat, a deleter) on BG until Stop.
func (r *Run) Serve(service func(bg context.Context)) {
	r.services.Go(func() { service(r.BG) })
}

// Stop shuts the Run down once its polling has returned: it waits for the
// handlers (cancelling Work after the shutdown timeout, then waiting up to
// shutdown.Grace more), calls drained (what the adapter does once no
// handler runs: flush its deletes, give back what it holds, close its
// connections), then stops BG and waits for the services. It returns the
// error the Run gave up with, if any, joined with an error if handlers were
// still running.
func (r *Run) Stop(drained func()) error {
	err := shutdown.Wait(&r.handlers, r.cfg.ShutdownTimeout, r.cancelWork, r.cfg.Log, r.cfg.Name)
	if drained != nil {
		drained()
	}
	r.stopBG()
	r.services.Wait()
	r.cancelWork()
	r.stopLog()
	return r.End(err)
}
