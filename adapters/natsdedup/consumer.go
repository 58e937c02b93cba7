package natsdedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/consumeropt"
	"github.com/dedupkit/dedup/internal/heartbeat"
	"github.com/dedupkit/dedup/internal/slots"
)

// minAckWait is the shortest AckWait Run accepts: the heartbeat sends
// InProgress every third of it.
const minAckWait = time.Second

// Consumer pulls messages from a JetStream pull consumer and runs them
// through a dedup.Wrapper, then acts on each outcome. The messages of one
// pull are claimed in one store call, handled concurrently and their
// successes completed together ([dedup.Wrapper.HandleConcurrent]); the next
// batch is pulled and handled meanwhile. The outcomes:
//
//   - OutcomeProcessed, OutcomeDuplicate: the message is acknowledged with
//     DoubleAck, which the server confirms (or Ack, [WithPlainAck]).
//   - OutcomeDeadLettered, OutcomeConflict: the wrapper has parked the
//     message in its dead-letter sink and recorded it; the message is
//     terminated (Term), so that the server never delivers it again and
//     reports it as terminated, not as processed, in its advisories.
//   - OutcomeRetry: NakWithDelay(Result.RetryAfter): the server delivers it
//     again after the backoff.
//   - OutcomeInFlight (the event is being handled elsewhere): NakWithDelay
//     of the wrapper's RetryAfter or [WithInFlightDelay], the shorter.
//   - An error (the store or the sink unreachable): NakWithDelay with a
//     backoff that grows while errors last. Nothing is acknowledged.
//
// While a message is held, a heartbeat sends InProgress every third of the
// consumer's AckWait, so that a handler may take longer than AckWait
// without the message being delivered to anyone else. The store lease of
// each call is the AckWait (dedup.CallLease) unless the wrapper sets
// dedup.WithLease, so that after a crash the message comes back about when
// its claim can be taken over.
//
// The JetStream consumer must have AckExplicitPolicy. Its MaxDeliver should
// be -1 (unlimited, the default) or larger than the wrapper's
// dedup.WithMaxAttempts: every delivery counts, those answered
// OutcomeInFlight too, and the server does not deliver a message again once
// MaxDeliver is reached, so the wrapper could not dead-letter it. Messages
// are handled in no particular order.
//
// Several Consumers, in one process or many, may pull from one durable
// consumer: the wrapper gives each event one effect.
type Consumer struct {
	cons jetstream.Consumer
	w    *dedup.Wrapper[jetstream.Msg]
	cfg  config
	log  *slog.Logger
	nc   *nats.Conn // WithJetStream's, or nil
	// connLost is set while Run sees nc lost.
	connLost atomic.Pointer[connLoss]
	// dlqMissing is set while Run finds no stream capturing a dead-letter
	// subject.
	dlqMissing adapterkit.Fault
}

// NewConsumer returns a Consumer pulling from cons and running messages
// through w, which should read messages with [Messages].
func NewConsumer(cons jetstream.Consumer, w *dedup.Wrapper[jetstream.Msg], opts ...Opt) (*Consumer, error) {
	cfg, err := consumeropt.Build(defaultConfig(), opts, Opt.apply, (*config).validate)
	if err != nil {
		return nil, err
	}
	switch {
	case cons == nil:
		return nil, fmt.Errorf("%w: natsdedup: nil jetstream.Consumer", dedup.ErrConfig)
	case w == nil:
		return nil, fmt.Errorf("%w: natsdedup: nil wrapper", dedup.ErrConfig)
	}
	log := cfg.Logger
	if info := cons.CachedInfo(); info != nil {
		log = log.With(slog.String("stream", info.Stream), slog.String("consumer", info.Name))
	}
	c := &Consumer{cons: cons, w: w, cfg: cfg, log: log}
	if cfg.js != nil {
		c.nc = cfg.js.Conn()
	} else {
		log.Warn("natsdedup: no WithJetStream: Health cannot see a lost connection or a missing dead-letter stream")
	}
	return c, nil
}

// Run pulls and handles messages until ctx is done, then shuts down and
// returns nil: it stops pulling (a pull in progress is waited for, up to
// [WithFetchWait], and what it brings is naked), lets running handlers
// finish (cancelling their contexts after [WithShutdownTimeout]), and naks
// the messages it will not handle, so that the server delivers them again
// at once. No goroutine of Run's outlives it.
//
// Run first reads the consumer's info: it fails at once if that fails
// (unless ctx is done by then), or, with an error matching dedup.ErrConfig,
// if the consumer's ack policy is not explicit. It returns an error if the
// NATS connection is closed for good, and, with [WithMaxOutage], one
// matching [ErrOutage] once settling messages has kept failing for longer
// than that bound. While the connection is down, pulls come back empty and
// are retried; the messages held meanwhile keep their handlers, and their
// acknowledgements and naks reach the server once the connection is back.
func (c *Consumer) Run(ctx context.Context) error {
	r, err := c.prepare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started: nothing was pulled
		}
		return err
	}
	r.Run = adapterkit.Start(ctx, c.w, adapterkit.Config{
		Name: "natsdedup", Log: c.log,
		ShutdownTimeout: c.cfg.ShutdownTimeout, MaxOutage: c.cfg.MaxOutage,
		InFlightDelay: c.cfg.InFlightDelay, Backoff: adapterkit.FailureBackoff,
	})
	r.Serve(r.hb.Run)
	if c.cfg.js != nil {
		r.Serve(c.watchConn)
		r.Serve(r.watchDLQ)
	}
	if err := r.poll(r.Ctx); err != nil {
		r.GiveUp(err)
	}
	return r.Stop(nil)
}

// runner is the state of one Run.
type runner struct {
	*Consumer
	*adapterkit.Run
	info       *jetstream.ConsumerInfo // as Run began
	ackWait    time.Duration
	fetchWait  time.Duration
	batch      int
	maxDeliver int
	slots      *slots.Slots
	hb         *heartbeat.Held[jetstream.Msg]
	// maxDeliverLogged is done once a message reached MaxDeliver unsettled.
	maxDeliverLogged sync.Once
}

// prepare reads the consumer's configuration and returns a runner for it.
func (c *Consumer) prepare(ctx context.Context) (*runner, error) {
	info, err := c.cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsdedup: read the consumer's info: %w", err)
	}
	cc := info.Config
	if cc.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: natsdedup: consumer %s of stream %s has ack policy %s, want %s: a message must be acknowledged only once it is settled",
			dedup.ErrConfig, info.Name, info.Stream, cc.AckPolicy, jetstream.AckExplicitPolicy)
	}
	ackWait := cc.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second // the server's default
	}
	if c.cfg.ackWait > 0 {
		if c.cfg.ackWait > ackWait {
			return nil, fmt.Errorf("%w: natsdedup: WithAckWait(%v) exceeds the AckWait of consumer %s (%v)",
				dedup.ErrConfig, c.cfg.ackWait, info.Name, ackWait)
		}
		ackWait = c.cfg.ackWait
	}
	if ackWait < minAckWait {
		return nil, fmt.Errorf("%w: natsdedup: consumer %s has an AckWait of %v, under the %v a heartbeat can keep",
			dedup.ErrConfig, info.Name, ackWait, minAckWait)
	}
	if err := c.w.CheckCallLease(ackWait, fmt.Sprintf("the AckWait of consumer %s, %v", info.Name, ackWait)); err != nil {
		return nil, err
	}
	batch := min(c.cfg.batchSize, c.cfg.workers)
	if cc.MaxRequestBatch > 0 {
		batch = min(batch, cc.MaxRequestBatch)
	}
	wait := c.cfg.fetchWait
	if cc.MaxRequestExpires > 0 {
		wait = min(wait, cc.MaxRequestExpires)
	}
	r := &runner{
		Consumer: c, info: info, ackWait: ackWait, fetchWait: wait, batch: batch, maxDeliver: cc.MaxDeliver,
		slots: slots.New(c.cfg.workers),
	}
	r.hb = newHeartbeat(ackWait/3, c.log)
	return r, nil
}

// poll pulls batches and dispatches them until ctx is done; it returns an
// error only when the connection is closed for good.
func (r *runner) poll(ctx context.Context) error {
	pullFailures := 0
	for {
		n := r.slots.Take(ctx, r.batch)
		if n == 0 {
			return nil
		}
		msgs, err := r.fetch(ctx, n)
		r.slots.Give(n - len(msgs))
		if len(msgs) > 0 {
			r.hb.Add(msgs...)
			r.Dispatch(func() { r.handle(msgs) })
		}
		if err == nil {
			pullFailures = 0
			continue
		}
		if errors.Is(err, nats.ErrConnectionClosed) {
			return fmt.Errorf("natsdedup: pull: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
		pullFailures++
		wait := dedup.ExponentialBackoff(100*time.Millisecond, 10*time.Second)(pullFailures)
		r.log.Warn("natsdedup: pull failed", slog.Any("error", err), slog.String("retry_in", wait.String()))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// fetch pulls up to n messages: those pending at once, else the first to
// arrive within the fetch wait together with those pending right after it.
// A pull in progress is not cancelled when ctx ends: the server would keep
// what it sends to an abandoned pull until its AckWait ran out.
func (r *runner) fetch(ctx context.Context, n int) ([]jetstream.Msg, error) {
	msgs, err := collect(r.cons.FetchNoWait(n))
	if len(msgs) > 0 || err != nil || ctx.Err() != nil {
		return msgs, err
	}
	msgs, err = collect(r.cons.Fetch(1, jetstream.FetchMaxWait(r.fetchWait)))
	if len(msgs) == 0 || err != nil || n == 1 {
		return msgs, err
	}
	more, err := collect(r.cons.FetchNoWait(n - 1))
	return append(msgs, more...), err
}

// collect reads a pull's messages to the end.
func collect(b jetstream.MessageBatch, err error) ([]jetstream.Msg, error) {
	if err != nil {
		return nil, err
	}
	var msgs []jetstream.Msg
	for m := range b.Messages() {
		msgs = append(msgs, m)
	}
	return msgs, b.Error()
}

// handle runs one pull's messages through the wrapper and acts on their
// outcomes.
func (r *runner) handle(msgs []jetstream.Msg) {
	defer r.slots.Give(len(msgs))
	acks := make([]jetstream.Msg, 0, len(msgs))
	adapterkit.Concurrent(r.Batch(), msgs, func(ms []jetstream.Msg, yield func(int, dedup.Result, error)) error {
		return r.w.HandleConcurrent(r.Work, ms, yield, dedup.CallLease(r.ackWait))
	}, func(i int, res dedup.Result, d adapterkit.Decision) {
		if r.act(msgs[i], res, d) {
			acks = append(acks, msgs[i])
		}
	})
	r.ack(acks)
}

// act does what d decided for m, except an acknowledgement, which it leaves
// to the caller by returning true.
func (r *runner) act(m jetstream.Msg, res dedup.Result, d adapterkit.Decision) (ack bool) {
	r.hb.Remove(m)
	switch d.Action {
	case adapterkit.Ack:
		return true
	case adapterkit.Park:
		// Terminated, not acknowledged: the server reports it as such.
		if err := m.Term(); err != nil {
			r.log.Warn("natsdedup: dead-lettered message not terminated; it may come back and be acknowledged as a duplicate",
				slog.Any("key", res.Key), slog.Any("error", err))
		}
		return false
	}
	// Redeliver: with a failure backoff, never Lapse.
	switch {
	case d.Err != nil:
		d.LogFailure(r.Work, r.log, "natsdedup: message not acknowledged; it will come back",
			slog.String("subject", m.Subject()), slog.Any("key", res.Key))
	case res.Outcome == dedup.OutcomeInFlight || res.Outcome == dedup.OutcomeRetry:
		r.checkMaxDeliver(m, res)
	}
	r.nak(m, d.Delay)
	return false
}

// checkMaxDeliver logs, once per Run, a message the server will not deliver
// again although it is not settled: the consumer's MaxDeliver is too low.
func (r *runner) checkMaxDeliver(m jetstream.Msg, res dedup.Result) {
	if r.maxDeliver <= 0 {
		return
	}
	md, err := m.Metadata()
	if err != nil || md.NumDelivered < uint64(r.maxDeliver) {
		return
	}
	r.maxDeliverLogged.Do(func() {
		r.log.Error("natsdedup: a message reached the consumer's MaxDeliver unsettled; the server will not deliver it again, so the wrapper cannot retry nor dead-letter it: set MaxDeliver to -1 or above dedup.WithMaxAttempts",
			slog.Int("max_deliver", r.maxDeliver), slog.Any("key", res.Key), slog.String("outcome", res.Outcome.String()))
	})
}

// nak asks the server to deliver m again after d.
func (r *runner) nak(m jetstream.Msg, d time.Duration) {
	if err := m.NakWithDelay(max(d, 0)); err != nil {
		r.log.Warn("natsdedup: nak failed; the message comes back when its AckWait runs out",
			slog.String("subject", m.Subject()), slog.Any("error", err))
	}
}

// ack acknowledges settled messages, waiting for the server's confirmation
// of each unless WithPlainAck.
func (r *runner) ack(msgs []jetstream.Msg) {
	warn := func(m jetstream.Msg, err error) {
		r.log.Warn("natsdedup: acknowledgement failed; the message is settled and, should it come back, is acknowledged as a duplicate",
			slog.String("subject", m.Subject()), slog.Any("error", err))
	}
	if r.cfg.plainAck {
		for _, m := range msgs {
			if err := m.Ack(); err != nil {
				warn(m, err)
			}
		}
		return
	}
	var wg sync.WaitGroup
	for _, m := range msgs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.BG, r.cfg.ackTimeout)
			defer cancel()
			if err := m.DoubleAck(ctx); err != nil {
				warn(m, err)
			}
		})
	}
	wg.Wait()
}
