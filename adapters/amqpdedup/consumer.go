package amqpdedup

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/amqpconn"
	"github.com/dedupkit/dedup/internal/consumeropt"
)

// Consumer consumes one RabbitMQ queue with manual acknowledgements and runs
// each delivery through a dedup.Wrapper, then acts on its outcome.
// Deliveries are handled in batches, several at once: the deliveries that
// arrive within a short linger of each other while earlier batches are
// being handled ([WithBatchSize], [WithLinger]) are claimed in one store
// call, handled concurrently and their successes completed together
// ([dedup.Wrapper.HandleConcurrent]). The outcomes:
//
//   - OutcomeProcessed, OutcomeDuplicate, OutcomeDeadLettered (the letter
//     published to the wrapper's sink, confirmed by the broker, first),
//     OutcomeConflict: the delivery is acknowledged.
//   - OutcomeRetry: the delivery is held for Result.RetryAfter, then
//     returned to the queue (nack with requeue), so it comes back after the
//     backoff.
//   - OutcomeInFlight (the event is being handled elsewhere): the delivery
//     is held for [WithInFlightDelay], then returned to the queue.
//   - An error (store or sink unreachable): the delivery is held for
//     [WithErrorBackoff], then returned to the queue.
//
// Nothing is acknowledged that is not settled. RabbitMQ has no visibility
// timeout: a delivery stays with its consumer until it is acknowledged or
// its channel closes, and the wrapper's heartbeat keeps the store lease
// while a handler runs. A held delivery counts against the prefetch;
// RabbitMQ's consumer_timeout (30 min by default) must exceed the longest
// handler plus backoff.
//
// When the connection or the channel is lost (the broker restarts, the
// network drops, the broker cancels the consumer because the queue was
// deleted), RabbitMQ returns every unacknowledged delivery to the queue.
// The Consumer connects again at once, then every 0.5 to 1 s while it
// fails (a backoff of its own, not [WithErrorBackoff], so that the queue is
// consumed again within about a second of the broker's return), logging the
// failure at WARN with the queue's name, again every 30 s while it lasts,
// and the return at INFO with how long it took; handlers still running
// on the lost channel finish and record their outcomes, so the redelivered
// copies are answered as duplicates (or, while they run, held as in
// flight) and acknowledged on the new channel.
type Consumer struct {
	url   string
	queue string
	w     *dedup.Wrapper[amqp.Delivery]
	// notConsuming is why Run cannot consume the queue, while it cannot.
	notConsuming atomic.Pointer[consumeFailure]
	// mismatch is set once the wrapper reads deliveries with the Messages
	// of another queue.
	mismatch adapterkit.Fault
	// dlq is the dead-letter queue Run checks ("": none); dlqMissing is
	// set while it is missing.
	dlq        string
	dlqMissing adapterkit.Fault
	cfg        config
	log        *slog.Logger
}

// NewConsumer returns a Consumer of queue on the broker at url (an amqp://
// or amqps:// URI) running deliveries through w, which reads them with
// [Messages] of the same queue (or of ""). The queue must exist when Run
// starts.
//
// The deliveries the Consumer hands to w carry its queue and its type (see
// [Messages]): a letter's origin, hence its dead-letter queue, is the
// consumed queue whatever name Messages was given. A wrapper reading them
// with the Messages of another queue is a configuration error: the first
// delivery logs it at ERROR and [Consumer.Health] reports it (matching
// dedup.ErrConfig) from then on.
//
// At each connection, before consuming, the Consumer finds out whether the
// queue is a quorum queue, the only kind whose x-delivery-count the broker
// writes, on a short connection of its own: RabbitMQ refuses a consumer
// with a global prefetch on a quorum queue, and accepts it on a classic one
// (then cancelled at once; a message sent to it in that instant returns to
// the queue marked redelivered). The refusal shows in the broker's log as
// a NOT_IMPLEMENTED connection error ("does not support global qos").
func NewConsumer(url, queue string, w *dedup.Wrapper[amqp.Delivery], opts ...Opt) (*Consumer, error) {
	cfg, err := consumeropt.Build(defaultConfig(), opts, Opt.apply, (*config).validate)
	if err != nil {
		return nil, err
	}
	if _, err := amqp.ParseURI(url); err != nil {
		return nil, fmt.Errorf("%w: amqpdedup: %v", dedup.ErrConfig, err)
	}
	switch {
	case queue == "":
		return nil, fmt.Errorf("%w: amqpdedup: empty queue name", dedup.ErrConfig)
	case w == nil:
		return nil, fmt.Errorf("%w: amqpdedup: nil wrapper", dedup.ErrConfig)
	}
	cfg.batchSize = min(cfg.batchSize, cfg.prefetch)
	dlq := queue + ".dlq"
	if cfg.dlqSet {
		dlq = cfg.dlq
	}
	return &Consumer{url: url, queue: queue, w: w, dlq: dlq, cfg: cfg, log: cfg.Logger.With(slog.String("queue", queue))}, nil
}

// Run consumes and handles deliveries until ctx is done, then shuts down and
// returns nil: it cancels the consumer, lets running handlers finish
// (cancelling their contexts after [WithShutdownTimeout]), returns the
// deliveries it holds to the queue and closes the connection. It connects
// again whenever the connection or the channel is lost. With
// [WithMaxOutage], Run also shuts down, and returns an error matching
// [ErrOutage], once settling deliveries has kept failing for longer than
// that bound. Several Runs of one Consumer at once are several consumers of
// the queue.
func (c *Consumer) Run(ctx context.Context) error {
	r := &runner{Consumer: c, held: make(map[*time.Timer]amqp.Delivery)}
	r.Run = adapterkit.Start(ctx, c.w, adapterkit.Config{
		Name: "amqpdedup: " + c.queue, Log: c.log,
		ShutdownTimeout: c.cfg.ShutdownTimeout, MaxOutage: c.cfg.MaxOutage,
		InFlightDelay: c.cfg.InFlightDelay, Backoff: c.cfg.errorBackoff,
	})
	ctx = r.Ctx
	var sessions []*session
	for failures := 0; ctx.Err() == nil; {
		s, err := r.open(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			failures++
			wait := reconnectDelay(failures)
			c.cannotConsume(err, failures, wait)
			sleep(ctx, wait)
			continue
		}
		if f := c.notConsuming.Swap(nil); f != nil {
			c.log.Info("amqpdedup: consuming the queue again", slog.String("after", ago(f.since)))
		} else if len(sessions) > 0 {
			c.log.Info("amqpdedup: consuming the queue again")
		}
		failures = 0
		sessions = append(sessions, s)
		if lost := r.consume(ctx, s); lost != nil && ctx.Err() == nil {
			c.log.Warn("amqpdedup: consuming stopped; connecting again (unacknowledged deliveries return to the queue)",
				slog.Any("error", lost))
			s.conn.Close()
		}
	}
	c.notConsuming.Store(nil)
	c.dlqMissing.Forget() // Health speaks of a running consumer only
	return r.Stop(func() {
		r.returnHeld()
		for _, s := range sessions {
			s.conn.Close()
		}
	})
}

// consumeFailure is why, and since when, Run cannot consume the queue.
type consumeFailure struct {
	since  time.Time
	warned time.Time // when it was last logged at WARN
	err    error
}

// reconnectDelay is the wait before the next try to consume after failures
// tries in a row failed: 250 to 500 ms after the first, then 0.5 to 1 s,
// jittered so that many consumers do not dial at once. It is the
// connection's own, not the handlers' error backoff: the queue is consumed
// again within about a second of the broker's return.
func reconnectDelay(failures int) time.Duration {
	return dedup.ExponentialBackoff(500*time.Millisecond, time.Second)(failures)
}

// cannotConsumeReminder is how often a failure to consume that goes on is
// logged again at WARN; the tries between are logged at DEBUG.
const cannotConsumeReminder = 30 * time.Second

// cannotConsume records err, the failures-th failure in a row to consume,
// as why Run cannot consume (keeping the time of the first), and logs it
// with the wait before the next try: at WARN the first and one every
// cannotConsumeReminder, else at DEBUG.
func (c *Consumer) cannotConsume(err error, failures int, wait time.Duration) {
	f := &consumeFailure{since: time.Now(), warned: time.Now(), err: err}
	level := slog.LevelWarn
	if prev := c.notConsuming.Load(); prev != nil {
		f.since, f.warned = prev.since, prev.warned
		if time.Since(prev.warned) < cannotConsumeReminder {
			level = slog.LevelDebug
		} else {
			f.warned = time.Now()
		}
	}
	c.notConsuming.Store(f)
	c.log.Log(context.Background(), level, "amqpdedup: cannot consume the queue; trying again", slog.Any("error", err),
		slog.Int("tries", failures), slog.String("for", ago(f.since)), slog.String("retry_in", wait.String()))
}

// ago says how long ago t was, as a Go duration.
func ago(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

// runner is the state of one Run.
type runner struct {
	*Consumer
	*adapterkit.Run

	mu   sync.Mutex
	held map[*time.Timer]amqp.Delivery // to be returned to the queue when their timer fires
	// batches counts the batches dispatched and not yet handled.
	batches atomic.Int64
}

// session is one connection's consumption of the queue.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	tag        string
	deliveries <-chan amqp.Delivery
	acker      *delivered // the Acknowledger of its deliveries
	closed     chan *amqp.Error
	cancelled  chan string
	dlqFound   bool // or nothing to check
}

// open finds out the queue's type, connects, sets the prefetch and starts
// consuming.
func (r *runner) open(ctx context.Context) (*session, error) {
	quorum, err := probeQuorum(r.url, r.cfg.amqp, r.queue)
	if err != nil {
		return nil, err
	}
	conn, err := amqpconn.Dial(r.url, r.cfg.amqp, "amqpdedup "+r.queue)
	if err != nil {
		return nil, fmt.Errorf("amqpdedup: connect: %w", err)
	}
	s := &session{conn: conn, tag: "amqpdedup-" + rand.Text()[:10]}
	fail := func(step string, err error) (*session, error) {
		conn.Close()
		return nil, fmt.Errorf("amqpdedup: %s on queue %q: %w", step, r.queue, err)
	}
	if s.ch, err = conn.Channel(); err != nil {
		return fail("open a channel", err)
	}
	s.acker = &delivered{Acknowledger: s.ch, c: r.Consumer, quorum: quorum}
	if err := s.ch.Qos(r.cfg.prefetch, 0, false); err != nil {
		return fail("set the prefetch", err)
	}
	s.dlqFound = r.checkDLQ(conn)
	s.closed = s.ch.NotifyClose(make(chan *amqp.Error, 1))
	s.cancelled = s.ch.NotifyCancel(make(chan string, 1))
	if s.deliveries, err = s.ch.ConsumeWithContext(ctx, r.queue, s.tag, false, false, false, false, nil); err != nil {
		return fail("consume", err)
	}
	return s, nil
}

// consume dispatches s's deliveries in batches until ctx is done (nil) or
// the session is lost (why).
func (r *runner) consume(ctx context.Context, s *session) error {
	var recheck <-chan time.Time
	if !s.dlqFound {
		t := time.NewTicker(dlqRecheck)
		defer t.Stop()
		recheck = t.C
	}
	for {
		select {
		case <-recheck:
			if r.checkDLQ(s.conn) {
				recheck = nil
			}
		case <-ctx.Done():
			// Deliveries already sent to this channel stay unacknowledged
			// and return to the queue when it closes.
			_ = s.ch.Cancel(s.tag, false)
			return nil
		case d, ok := <-s.deliveries:
			if !ok {
				if ctx.Err() != nil {
					return nil // ConsumeWithContext cancelled the consumer
				}
				return lostWhy(s)
			}
			batch := r.fill(ctx, s, d)
			r.batches.Add(1)
			r.Dispatch(func() {
				defer r.batches.Add(-1)
				r.handle(batch)
			})
		}
	}
}

// fill returns a batch of first and the deliveries that follow it: first
// alone when no batch is being handled, so that a lone delivery never
// waits; else with those that arrive within the linger of first, up to the
// batch size (see [WithLinger]). A closed channel or ctx done ends the
// batch early; consume sees why next.
func (r *runner) fill(ctx context.Context, s *session, first amqp.Delivery) []amqp.Delivery {
	first.Acknowledger = s.acker
	batch := []amqp.Delivery{first}
	if r.batches.Load() == 0 || r.cfg.batchSize == 1 {
		return batch
	}
	linger := time.NewTimer(r.cfg.linger)
	defer linger.Stop()
	for len(batch) < r.cfg.batchSize {
		select {
		case d, ok := <-s.deliveries:
			if !ok {
				return batch
			}
			d.Acknowledger = s.acker
			batch = append(batch, d)
		case <-linger.C:
			return batch
		case <-ctx.Done():
			return batch
		}
	}
	return batch
}

// lostWhy says why s's deliveries stopped.
func lostWhy(s *session) error {
	select {
	case tag := <-s.cancelled:
		return fmt.Errorf("the broker cancelled consumer %s (the queue deleted, or its leader moved)", tag)
	case err := <-s.closed:
		if err != nil {
			return err
		}
	default:
	}
	if s.conn.IsClosed() {
		return errors.New("connection closed")
	}
	return errors.New("channel closed")
}

// handle runs batch through the wrapper and acts on each outcome.
func (r *runner) handle(batch []amqp.Delivery) {
	adapterkit.Concurrent(r.Batch(), batch, func(ds []amqp.Delivery, yield func(int, dedup.Result, error)) error {
		return r.w.HandleConcurrent(r.Work, ds, yield)
	}, func(i int, res dedup.Result, d adapterkit.Decision) { r.act(batch[i], res, d) })
}

// act does what d decided for delivery.
func (r *runner) act(delivery amqp.Delivery, res dedup.Result, d adapterkit.Decision) {
	if d.Settled() { // Ack and Park alike: the letter is durable
		if err := delivery.Ack(false); err != nil {
			r.log.Debug("amqpdedup: acknowledgement lost with its channel; the redelivery is answered as a duplicate",
				slog.Any("key", res.Key), slog.Any("error", err))
		}
		return
	}
	if d.Err != nil {
		d.LogFailure(r.Work, r.log, "amqpdedup: delivery not acknowledged; it will come back",
			slog.String("message_id", delivery.MessageId), slog.Any("key", res.Key))
	}
	r.holdBack(delivery, d.Delay) // Redeliver: with a failure backoff, never Lapse
}

// holdBack returns d to the queue after delay, or at once when Run is
// stopping.
func (r *runner) holdBack(d amqp.Delivery, delay time.Duration) {
	if delay <= 0 || r.Ctx.Err() != nil {
		requeue(d)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		r.mu.Lock()
		_, ok := r.held[t]
		delete(r.held, t)
		r.mu.Unlock()
		if ok {
			requeue(d)
		}
	})
	r.held[t] = d
}

// returnHeld returns every held delivery to the queue now.
func (r *runner) returnHeld() {
	r.mu.Lock()
	held := r.held
	r.held = make(map[*time.Timer]amqp.Delivery)
	r.mu.Unlock()
	for t, d := range held {
		t.Stop()
		requeue(d)
	}
}

// requeue returns d to the queue. On a lost channel the broker has done so
// already.
func requeue(d amqp.Delivery) { _ = d.Nack(false, true) }

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
