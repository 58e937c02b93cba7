package sqsdedup

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/consumeropt"
	"github.com/dedupkit/dedup/internal/group"
	"github.com/dedupkit/dedup/internal/heartbeat"
	"github.com/dedupkit/dedup/internal/logattr"
	"github.com/dedupkit/dedup/internal/slots"
	"github.com/dedupkit/dedup/internal/sqsbody"
)

// Consumer receives messages from one SQS queue and runs them through a
// dedup.Wrapper, then acts on each outcome. The messages of one receive from
// a standard queue (under a backlog, with those of the receives made right
// after it: see [WithWorkers]) are claimed in one store call, handled
// concurrently and their successes completed together
// ([dedup.Wrapper.HandleConcurrent]), so their outcomes are acted on once the
// slowest of them is settled; the next batch is received and handled
// meanwhile. The outcomes:
//
//   - OutcomeProcessed, OutcomeDuplicate, OutcomeDeadLettered,
//     OutcomeConflict: the message is deleted, in batches
//     (DeleteMessageBatch, retrying entries reported as failed).
//   - OutcomeRetry: the message's visibility is set to Result.RetryAfter,
//     so it comes back after the backoff.
//   - OutcomeInFlight (the event is being handled elsewhere): the message becomes
//     visible again after a short delay ([WithInFlightDelay]); it is never
//     deleted nor kept invisible by the heartbeat past that delay. When
//     another batch of this consumer may hold the event (one was being
//     handled meanwhile), the message is first looked at again once those
//     batches are settled, within the delay: a copy of an event this
//     consumer is handling is then a duplicate at once, not a second later.
//   - An error (store or DLQ unreachable): nothing; the message comes back
//     when its visibility timeout runs out.
//
// While a message is held, a heartbeat extends its visibility timeout before
// it runs out, so a handler may take longer than the queue's timeout.
//
// On a FIFO queue (its URL ends in ".fifo"), the messages of one
// MessageGroupId are handled in order, one at a time; a message that does not
// settle holds back the rest of its group in that receive, which is given
// back at once (SQS then delivers nothing more of the group before the held
// message).
//
// The store lease is the queue's visibility timeout (unless the Wrapper sets
// dedup.WithLease), so that after a crash the message comes back about when
// its claim can be taken over; the heartbeat extends both together.
type Consumer struct {
	client *sqs.Client
	url    string
	fifo   bool
	w      *dedup.Wrapper[types.Message]
	cfg    config
	log    *slog.Logger
	// noReceiveCount is done once a message came without its
	// ApproximateReceiveCount, which is then logged.
	noReceiveCount sync.Once
}

// NewConsumer returns a Consumer of the queue at queueURL running messages
// through w, which reads messages with [Messages] for the same URL: the
// letters' origin, where a redrive sends them back. Messages of another URL
// is an error matching dedup.ErrConfig, and so is a
// [WithVisibilityTimeout] longer than w's dedup.WithTTL, as Run's reading
// of the queue's own timeout is.
func NewConsumer(client *sqs.Client, queueURL string, w *dedup.Wrapper[types.Message], opts ...Opt) (*Consumer, error) {
	cfg, err := consumeropt.Build(defaultConfig(), opts, Opt.apply, (*config).validate)
	if err != nil {
		return nil, err
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: sqsdedup: nil SQS client", dedup.ErrConfig)
	case checkQueueURL(queueURL) != nil:
		return nil, fmt.Errorf("%w: sqsdedup: %v", dedup.ErrConfig, checkQueueURL(queueURL))
	case w == nil:
		return nil, fmt.Errorf("%w: sqsdedup: nil wrapper", dedup.ErrConfig)
	}
	if read := originQueue(w.Messages()); read != "" && read != queueURL {
		return nil, fmt.Errorf("%w: sqsdedup: the wrapper reads messages with Messages(%q) but the Consumer receives from %q: "+
			"give both the same URL (a letter's origin, where a redrive sends it back, is Messages')", dedup.ErrConfig, read, queueURL)
	}
	if cfg.visibility > 0 {
		vis := time.Duration(seconds(cfg.visibility)) * time.Second
		if err := w.CheckCallLease(vis, fmt.Sprintf("WithVisibilityTimeout(%v)", vis)); err != nil {
			return nil, fmt.Errorf("sqsdedup: %w", err)
		}
	}
	log := cfg.Logger.With(slog.String("queue", queueURL))
	return &Consumer{client: client, url: queueURL, fifo: isFIFO(queueURL), w: w, cfg: cfg, log: log}, nil
}

// VisibilityTimeout returns the visibility timeout of the queue at queueURL.
func VisibilityTimeout(ctx context.Context, client *sqs.Client, queueURL string) (time.Duration, error) {
	out, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl:       aws.String(queueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameVisibilityTimeout},
	})
	if err != nil {
		return 0, fmt.Errorf("sqsdedup: read the visibility timeout of %s: %w", queueURL, err)
	}
	v := out.Attributes[string(types.QueueAttributeNameVisibilityTimeout)]
	secs, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("sqsdedup: visibility timeout of %s is %q: %w", queueURL, v, err)
	}
	return time.Duration(secs) * time.Second, nil
}

// Run receives and handles messages until ctx is done, then shuts down and
// returns nil: it stops receiving (a long poll in progress is waited for, up
// to [WithWaitTime], and what it brings is given back), lets running
// handlers finish (cancelling their contexts after [WithShutdownTimeout]),
// deletes what settled, and gives the messages it will not handle back with
// visibility 0. Even if SQS or a handler hangs, it returns within the wait
// time plus the shutdown timeout plus 35 s; a handler still running then is
// reported as an error. Run fails at once if the queue's visibility timeout
// cannot be read, unless ctx is done by then, or, with an error matching
// dedup.ErrConfig, if it is longer than the wrapper's dedup.WithTTL (and
// the wrapper has no dedup.WithLease). With [WithMaxOutage], Run also
// shuts down, and returns an error matching [ErrOutage], once settling
// messages has kept failing for longer than that bound.
func (c *Consumer) Run(ctx context.Context) error {
	vis := c.cfg.visibility
	if vis == 0 {
		var err error
		if vis, err = VisibilityTimeout(ctx, c.client, c.url); err != nil {
			if ctx.Err() != nil {
				// Stopped before it started: nothing was received.
				return nil
			}
			return err
		}
	}
	vis = time.Duration(seconds(vis)) * time.Second
	if vis < time.Second {
		return fmt.Errorf("%w: %s has a visibility timeout of 0, which no heartbeat can keep: use WithVisibilityTimeout",
			dedup.ErrConfig, c.url)
	}
	if err := c.w.CheckCallLease(vis, fmt.Sprintf("the visibility timeout of %s, %v", c.url, vis)); err != nil {
		return fmt.Errorf("sqsdedup: %w", err)
	}

	r := c.start(ctx, vis)
	var pollers sync.WaitGroup
	for range c.cfg.pollers {
		pollers.Go(func() { r.poll(r.Ctx) })
	}
	pollers.Wait()
	return r.stop()
}

// runner is the state of one Run.
type runner struct {
	*Consumer
	*adapterkit.Run
	vis     time.Duration
	slots   *slots.Slots // free workers, one per message held
	hb      *heartbeat.Held[types.Message]
	del     *deleter
	batches *batches
}

// start returns a runner with its heartbeat and deleter running.
func (c *Consumer) start(ctx context.Context, vis time.Duration) *runner {
	r := &runner{Consumer: c, vis: vis, slots: slots.New(c.cfg.workers), batches: newBatches()}
	// An error leaves the message to come back when its visibility timeout
	// runs out (no Backoff: the timeout is the delay).
	r.Run = adapterkit.Start(ctx, c.w, adapterkit.Config{
		Name: "sqsdedup: " + c.url, Log: c.log,
		ShutdownTimeout: c.cfg.ShutdownTimeout, MaxOutage: c.cfg.MaxOutage, InFlightDelay: c.cfg.InFlightDelay,
	})
	// The store lease defaults to the visibility timeout (dedup.CallLease),
	// unless the wrapper sets dedup.WithLease.
	r.hb = newHeartbeat(r)
	r.del = newDeleter(r)
	r.Serve(r.hb.Run)
	r.Serve(r.del.run)
	return r
}

// stop waits for the handlers, flushes the deletes and stops the heartbeat,
// once polling has returned; it returns Run's error.
func (r *runner) stop() error { return r.Stop(r.del.stop) }

func (r *runner) poll(ctx context.Context) {
	failures := 0
	for {
		n := r.acquire(ctx)
		if n == 0 {
			return
		}
		out, err := r.receive(ctx, n, r.cfg.waitTime)
		if err != nil {
			r.release(n)
			if ctx.Err() != nil {
				return
			}
			failures++
			wait := dedup.ExponentialBackoff(time.Second, 30*time.Second)(failures)
			r.log.Warn("sqsdedup: receive failed", slog.Any("error", err), logattr.Duration("retry_in", wait))
			if sleep(ctx, wait) != nil {
				return
			}
			continue
		}
		failures = 0
		r.release(n - len(out.Messages))
		r.hb.Add(out.Messages...)
		msgs := out.Messages
		if len(msgs) == n {
			msgs = r.fill(ctx, msgs)
		}
		r.checkReceiveCount(msgs)
		r.dispatch(ctx, msgs)
	}
}

// maxReceivesPerBatch bounds the receives whose messages are handled
// together.
const maxReceivesPerBatch = 4

// batchSize is the most messages handled together from a standard queue:
// half the workers, so that the next batch is received while one is
// handled, within maxReceivesPerBatch receives, and at least one receive.
func (c *config) batchSize() int {
	return max(c.maxMessages, min(c.workers/2, maxReceivesPerBatch*c.maxMessages))
}

// fill adds to msgs, the messages of a receive that came back full, those of
// receives made at once (without waiting for messages to arrive) while each
// comes back full, workers are free and the batch is not full. Under a
// backlog, a batch then costs the store one claim and one completion for up
// to batchSize messages instead of for each receive's ten.
func (r *runner) fill(ctx context.Context, msgs []types.Message) []types.Message {
	if r.fifo {
		return msgs
	}
	for len(msgs) < r.cfg.batchSize() && ctx.Err() == nil {
		n := r.slots.TryTake(min(r.cfg.maxMessages, r.cfg.batchSize()-len(msgs)))
		if n == 0 {
			break
		}
		out, err := r.receive(ctx, n, 0)
		if err != nil {
			r.release(n)
			if ctx.Err() == nil {
				r.log.Warn("sqsdedup: receive failed", slog.Any("error", err))
			}
			break
		}
		r.release(n - len(out.Messages))
		r.hb.Add(out.Messages...)
		msgs = append(msgs, out.Messages...)
		if len(out.Messages) < n {
			break
		}
	}
	return msgs
}

// receive receives up to n messages, waiting up to wait (whole seconds) for
// messages to arrive. A receive in progress when ctx ends is
// not cancelled but waited for: SQS goes on with a long poll whose client has
// gone, and hides the messages it takes for a whole visibility timeout.
// What it returns is then given back at once.
func (r *runner) receive(ctx context.Context, n int, wait time.Duration) (*sqs.ReceiveMessageOutput, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait+callTimeout)
	defer cancel()
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(r.url),
		MaxNumberOfMessages:         int32(n),
		WaitTimeSeconds:             int32(wait / time.Second),
		VisibilityTimeout:           seconds(r.vis),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		// Real SQS answers both parameters; some SQS-compatible endpoints
		// know only the older one.
		//lint:ignore SA1019 the deprecated parameter is what those endpoints read
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
	}
	if r.fifo {
		// The SDK's retries of this receive then get the same messages
		// instead of leaving those of the lost response blocking their groups.
		in.ReceiveRequestAttemptId = aws.String(rand.Text())
	}
	return r.client.ReceiveMessage(ctx, in, sqsbody.KeepConnection)
}

// checkReceiveCount logs, once per Consumer, that the endpoint returns
// messages without their ApproximateReceiveCount. Attempts are then counted
// by the store alone, so a handler that crashes its process before the store
// records the attempt is not counted against dedup.WithMaxAttempts.
func (r *runner) checkReceiveCount(msgs []types.Message) {
	for _, m := range msgs {
		if _, ok := m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]; !ok {
			r.noReceiveCount.Do(func() {
				r.log.Warn("sqsdedup: the SQS endpoint returns no ApproximateReceiveCount; attempts are counted by the store only",
					slog.String("message_id", aws.ToString(m.MessageId)))
			})
			return
		}
	}
}

// acquire takes between one and maxMessages free worker slots, waiting for
// the first; it returns 0 when ctx is done.
func (r *runner) acquire(ctx context.Context) int { return r.slots.Take(ctx, r.cfg.maxMessages) }

func (r *runner) release(n int) { r.slots.Give(n) }

func (r *runner) dispatch(stop context.Context, msgs []types.Message) {
	if len(msgs) == 0 {
		return
	}
	if !r.fifo {
		r.Dispatch(func() { r.handleReceive(stop, msgs) })
		return
	}
	for _, g := range groups(msgs) {
		r.Dispatch(func() { r.handleGroup(stop, g) })
	}
}

// groups splits msgs by MessageGroupId, keeping their order.
func groups(msgs []types.Message) [][]types.Message {
	return group.By(msgs, func(m types.Message) string {
		return m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
	})
}

// handleReceive handles a batch of messages from a standard queue together:
// their keys claimed in one store call, their handlers run concurrently,
// their successes completed in one write. Those found in flight while
// other batches were being handled are looked at again once those are
// settled (see batches).
func (r *runner) handleReceive(stop context.Context, msgs []types.Message) {
	defer r.release(len(msgs))
	b := r.batches.start()
	defer r.batches.end(b)
	var again []types.Message
	var inFlight []dedup.Result
	decide := r.Policy.Batch(stop.Done())
	r.handleConcurrent(decide, msgs, func(m types.Message, res dedup.Result) bool {
		if res.Outcome == dedup.OutcomeInFlight && r.cfg.InFlightDelay > 0 && stop.Err() == nil && r.batches.shared(b) {
			again, inFlight = append(again, m), append(inFlight, res)
			return true
		}
		return false
	})
	if len(again) == 0 {
		return
	}
	// Until the other batches are settled, for at most the in-flight delay:
	// the longest a message in flight waits before it is looked at again.
	r.batches.waitOthers(stop, b, r.cfg.InFlightDelay)
	if stop.Err() != nil {
		var now []types.Message
		for i, m := range again {
			r.act(m, inFlight[i], decide.Decide(inFlight[i], nil), &now)
		}
		r.giveBack(0, now...)
		return
	}
	b = r.batches.start()
	defer r.batches.end(b)
	r.handleConcurrent(r.Policy.Batch(stop.Done()), again, nil)
}

// handleConcurrent runs msgs through HandleConcurrent and acts on each
// outcome, except those that hold takes over.
func (r *runner) handleConcurrent(decide *adapterkit.Batch, msgs []types.Message, hold func(types.Message, dedup.Result) bool) {
	var now []types.Message
	adapterkit.Concurrent(decide, msgs, func(ms []types.Message, yield func(int, dedup.Result, error)) error {
		return r.w.HandleConcurrent(r.Work, ms, yield, dedup.CallLease(r.vis))
	}, func(i int, res dedup.Result, d adapterkit.Decision) {
		if d.Err == nil && hold != nil && hold(msgs[i], res) {
			return
		}
		r.act(msgs[i], res, d, &now)
	})
	r.giveBack(0, now...)
}

// handleGroup handles one FIFO group's messages in order, stopping at the
// first that does not settle; the rest are given back at once.
func (r *runner) handleGroup(stop context.Context, msgs []types.Message) {
	var now []types.Message
	adapterkit.InOrder(r.Policy.Batch(stop.Done()), msgs, func(ms []types.Message, yield func(int, dedup.Result, error) bool) error {
		return r.w.HandleBatch(r.Work, ms, yield, dedup.CallStop(stop.Done()), dedup.CallLease(r.vis))
	}, func(i int, res dedup.Result, d adapterkit.Decision) {
		n := len(now)
		r.act(msgs[i], res, d, &now)
		if len(now) == n {
			r.release(1) // the others once given back
		}
	})
	r.giveBack(0, now...)
	r.release(len(now))
}

// act does what d decided for m. A message to give back at once is added
// to now instead, for the caller to give back with the others of its batch
// (giveBack): at shutdown, or behind a FIFO group's message not settled,
// that is one visibility call per ten messages, not one per message.
func (r *runner) act(m types.Message, res dedup.Result, d adapterkit.Decision, now *[]types.Message) {
	if d.Settled() { // Ack and Park alike: the letter is durable
		r.del.add(m)
		return
	}
	if d.Err != nil {
		d.LogFailure(r.Work, r.log, "sqsdedup: message not acknowledged; it will come back",
			slog.String("message_id", aws.ToString(m.MessageId)), slog.Any("key", res.Key))
	}
	switch {
	case d.Action == adapterkit.Lapse:
		r.hb.Remove(m) // back when its visibility timeout runs out
	case d.Delay <= 0:
		*now = append(*now, m)
	default:
		r.giveBack(d.Delay, m)
	}
}

// giveBack stops holding msgs and makes them visible again after d.
func (r *runner) giveBack(d time.Duration, msgs ...types.Message) {
	if len(msgs) == 0 {
		return
	}
	r.hb.Remove(msgs...)
	for _, batch := range chunks(msgs) {
		if lost := r.retryBatch(r.BG, "visibility change", batch, 3, r.visibilityCall(d)); len(lost) > 0 {
			r.log.Warn("sqsdedup: messages not given back; they come back when their visibility timeout runs out",
				slog.Int("messages", len(lost)))
		}
	}
}
