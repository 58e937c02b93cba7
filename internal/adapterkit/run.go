package adapterkit

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/dedupkit/dedup/internal/outage"
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
	// Health and Stats are the wrapper's.
	Health func() error
	Stats  func() outage.Snapshot
}

// Run is the skeleton of one Run of a Consumer that hands batches of
// deliveries to handlers: Start it, poll until Ctx is done, handing each
// batch to Dispatch, then Stop it.
type Run struct {
	// Ctx is done once the caller's context is, or once the Run gives up
	// (GiveUp): poll until then.
	Ctx context.Context
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
	giveUp     context.CancelCauseFunc
	cancelWork context.CancelFunc
	stopBG     context.CancelFunc
	stopLog    func() bool
	handlers   sync.WaitGroup
	services   sync.WaitGroup

	mu     sync.Mutex
	gaveUp error // the first error GiveUp was given
}

// Start returns a Run under ctx.
func Start(ctx context.Context, c Config) *Run {
	r := &Run{cfg: c}
	r.Ctx, r.giveUp = context.WithCancelCause(ctx)
	r.Work, r.cancelWork = context.WithCancel(context.WithoutCancel(ctx))
	r.BG, r.stopBG = context.WithCancel(context.WithoutCancel(ctx))
	r.Policy = &Policy{InFlightDelay: c.InFlightDelay, Backoff: c.Backoff,
		Outage: NewOutage(c.Health, c.Stats, c.MaxOutage, r.GiveUp)}
	r.stopLog = context.AfterFunc(r.Ctx, func() {
		c.Log.Info(c.Name + ": stopping: waiting for running handlers")
	})
	return r
}

// GiveUp stops the Run, which then returns err (an outage lasting longer
// than WithMaxOutage, a connection closed for good) unless it gave up with
// another error first.
func (r *Run) GiveUp(err error) {
	r.mu.Lock()
	if r.gaveUp == nil {
		r.gaveUp = err
	}
	r.mu.Unlock()
	r.giveUp(err)
}

// Stopping returns what is closed once the Run is stopping.
func (r *Run) Stopping() <-chan struct{} { return r.Ctx.Done() }

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
	r.giveUp(nil)
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.gaveUp, err)
}
