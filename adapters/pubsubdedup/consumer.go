package pubsubdedup

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/consumeropt"
	"github.com/dedupkit/dedup/internal/shutdown"
)

// Consumer receives the messages of one Pub/Sub subscription with the
// client's own Subscriber.Receive and runs each through a dedup.Wrapper,
// then acts on its outcome:
//
//   - OutcomeProcessed, OutcomeDuplicate, OutcomeDeadLettered (the letter
//     published to the wrapper's sink first), OutcomeConflict: the message
//     is acknowledged.
//   - OutcomeRetry: the message is nacked, so that it comes back. When the
//     subscription has a retry policy, at once: the server's backoff
//     applies. Without one the server would deliver it again at once, so it
//     is held for the wrapper's Result.RetryAfter first.
//   - OutcomeInFlight (the event is being handled elsewhere): held for the
//     wrapper's RetryAfter or [WithInFlightDelay], the shorter, then nacked.
//   - An error (the store or the sink unreachable): held for a backoff
//     that grows while errors last (1 s to 15 s), then nacked. Nothing is
//     acknowledged.
//
// While a message is held, the client extends its ack deadline by itself
// (its lease management, up to [WithMaxExtension]), each time by the
// subscription's ack deadline (or [WithAckDeadline]), so that a handler may
// run longer than the deadline and a crashed worker's message comes back
// within about it. That deadline is the store lease of each call
// (dedup.CallLease) unless the wrapper sets dedup.WithLease.
//
// Each message is claimed, handled and settled on its own, in the callback
// the client calls for it: at most [WithWorkers] at once. When the
// subscription has message ordering, the client calls the callbacks of one
// ordering key one after the other, and a message is settled before the
// next of its key is handled; a message nacked makes the server deliver it
// again with the rest of its key, in order.
//
// With a dead-letter policy on the subscription, Pub/Sub counts deliveries
// ([Messages] reads them as attempts) and forwards a message to its own
// dead-letter topic, without dedup's metadata, after MaxDeliveryAttempts:
// set it above dedup.WithMaxAttempts, since every delivery counts, those
// answered OutcomeInFlight too, so that the wrapper dead-letters first.
//
// Acknowledgements are not confirmed: one lost on the way brings the
// message back after its deadline, answered as a duplicate. Several
// Consumers, in one process or many, may receive from one subscription: the
// wrapper gives each event one effect.
type Consumer struct {
	client *pubsub.Client
	sub    string // the subscription's full name
	w      *dedup.Wrapper[*pubsub.Message]
	cfg    config
	log    *slog.Logger
}

// NewConsumer returns a Consumer of subscription (an ID in client's
// project, or a full name "projects/P/subscriptions/S") running messages
// through w, which should read them with [Messages]. The caller owns client
// and closes it after Run returns.
func NewConsumer(client *pubsub.Client, subscription string, w *dedup.Wrapper[*pubsub.Message], opts ...Opt) (*Consumer, error) {
	cfg, err := consumeropt.Build(defaultConfig(), opts, Opt.apply, (*config).validate)
	if err != nil {
		return nil, err
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: pubsubdedup: nil client", dedup.ErrConfig)
	case subscription == "":
		return nil, fmt.Errorf("%w: pubsubdedup: empty subscription", dedup.ErrConfig)
	case w == nil:
		return nil, fmt.Errorf("%w: pubsubdedup: nil wrapper", dedup.ErrConfig)
	}
	name := client.Subscriber(subscription).String()
	return &Consumer{client: client, sub: name, w: w, cfg: cfg, log: cfg.Logger.With(slog.String("subscription", name))}, nil
}

// Run receives and handles messages until ctx is done, then shuts down and
// returns nil: the client stops pulling (and nacks what it pulled but did
// not hand over), running handlers finish (their contexts cancelled after
// [WithShutdownTimeout]), the messages held for a delay are nacked at once,
// and Run returns once the client's Receive has. No goroutine of Run's
// outlives it.
//
// Run first reads the subscription: it fails at once if that fails (unless
// ctx is done by then). It returns the client's error when Receive fails
// for good (the subscription deleted, permission denied), and, with
// [WithMaxOutage], one matching [ErrOutage] once settling messages has kept
// failing for longer than that bound. While the server cannot be reached,
// the client retries by itself.
func (c *Consumer) Run(ctx context.Context) error {
	r, err := c.prepare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started: nothing was received
		}
		return err
	}
	r.Run = adapterkit.Start(ctx, c.w, adapterkit.Config{
		Name: "pubsubdedup", Log: c.log,
		ShutdownTimeout: c.cfg.ShutdownTimeout, MaxOutage: c.cfg.MaxOutage,
		InFlightDelay: c.cfg.InFlightDelay, Backoff: adapterkit.FailureBackoff,
	})
	sub := c.client.Subscriber(c.sub)
	sub.ReceiveSettings = r.settings()
	received := make(chan error, 1)
	go func() { received <- sub.Receive(r.Ctx, r.receive) }()
	select {
	case <-r.Ctx.Done():
	case err := <-received:
		received = nil
		if err == nil {
			err = fmt.Errorf("pubsubdedup: receive on %s ended", c.sub)
		}
		c.log.Error("pubsubdedup: receive failed; stopping", slog.Any("error", err))
		r.GiveUp(fmt.Errorf("pubsubdedup: receive on %s: %w", c.sub, err))
	}
	r.closeGate()
	return r.Stop(func() { r.awaitReceive(received) })
}

// awaitReceive waits for Receive to return, which it does once every
// message it handed over is acked or nacked and those acknowledgements are
// sent: at once when the handlers have all returned, which Stop waited for.
// Only a handler ignoring its cancelled context (which Stop reported)
// holds it back: then awaitReceive gives up after shutdown.Grace, leaving
// Receive to return when that handler does.
func (r *runner) awaitReceive(received <-chan error) {
	if received == nil {
		return
	}
	t := time.NewTimer(shutdown.Grace)
	defer t.Stop()
	select {
	case <-received:
	case <-t.C:
		r.log.Error("pubsubdedup: Receive has not returned; a handler still runs, ignoring its cancelled context")
	}
}

// runner is the state of one Run.
type runner struct {
	*Consumer
	*adapterkit.Run
	ackDeadline time.Duration
	retryPolicy bool // the subscription backs off nacked messages itself

	mu     sync.Mutex
	closed bool // no message is handed to a handler any more
}

// prepare reads the subscription's configuration and returns a runner for
// it.
func (c *Consumer) prepare(ctx context.Context) (*runner, error) {
	s, err := c.client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: c.sub})
	if err != nil {
		return nil, fmt.Errorf("pubsubdedup: read subscription %s: %w", c.sub, err)
	}
	deadline := time.Duration(s.GetAckDeadlineSeconds()) * time.Second
	if c.cfg.ackDeadline > 0 {
		deadline = c.cfg.ackDeadline
	}
	deadline = min(max(deadline, minAckDeadline), maxAckDeadline)
	if err := c.w.CheckCallLease(deadline, fmt.Sprintf("the ack deadline of subscription %s, %v", c.sub, deadline)); err != nil {
		return nil, err
	}
	return &runner{Consumer: c, ackDeadline: deadline, retryPolicy: s.GetRetryPolicy() != nil}, nil
}

// settings returns the client's receive settings: as many messages
// outstanding as workers, each one's ack deadline extended by the ack
// deadline at a time, up to the longest extension.
func (r *runner) settings() pubsub.ReceiveSettings {
	s := pubsub.DefaultReceiveSettings
	s.MaxOutstandingMessages = r.cfg.workers
	s.MaxExtension = r.cfg.maxExtension
	s.MinDurationPerAckExtension = r.ackDeadline
	s.MaxDurationPerAckExtension = r.ackDeadline
	// Graceful: Receive returns once every message it handed over is acked
	// or nacked and those acknowledgements are sent. (A timed shutdown
	// returns at once and may drop the acknowledgements not sent yet.)
	s.ShutdownOptions = &pubsub.ShutdownOptions{Behavior: pubsub.ShutdownBehaviorWaitForProcessing, Timeout: -1}
	return s
}

// receive is the client's callback for m: it hands m to a handler of the
// Run's and returns once m is acked or nacked, or nacks m when Run is
// stopping.
func (r *runner) receive(_ context.Context, m *pubsub.Message) {
	done := make(chan struct{})
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		m.Nack()
		return
	}
	r.Dispatch(func() {
		defer close(done)
		r.handle(m)
	})
	r.mu.Unlock()
	<-done
}

// closeGate makes receive nack every message from now on, so that Stop's
// wait for the handlers covers every one handed over.
func (r *runner) closeGate() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
}

// handle runs m through the wrapper and acts on its outcome.
func (r *runner) handle(m *pubsub.Message) {
	msgs := []*pubsub.Message{m}
	adapterkit.Concurrent(r.Batch(), msgs, func(ms []*pubsub.Message, yield func(int, dedup.Result, error)) error {
		return r.w.HandleConcurrent(r.Work, ms, yield, dedup.CallLease(r.ackDeadline), dedup.CallGroup(r.sub))
	}, func(_ int, res dedup.Result, d adapterkit.Decision) { r.act(m, res, d) })
}

// act does what d decided for m.
func (r *runner) act(m *pubsub.Message, res dedup.Result, d adapterkit.Decision) {
	if d.Settled() { // Ack and Park alike: the letter is durable
		m.Ack()
		return
	}
	if d.Err != nil {
		d.LogFailure(r.Work, r.log, "pubsubdedup: message not acknowledged; it will come back",
			slog.String("message_id", m.ID), slog.Any("key", res.Key))
	}
	delay := d.Delay // Redeliver: with a failure backoff, never Lapse
	if r.retryPolicy && d.Err == nil && res.Outcome == dedup.OutcomeRetry {
		delay = 0
	}
	r.holdBack(delay)
	m.Nack()
}

// holdBack waits for delay, or until Run is stopping.
func (r *runner) holdBack(delay time.Duration) {
	if delay <= 0 {
		return
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Ctx.Done():
	}
}
