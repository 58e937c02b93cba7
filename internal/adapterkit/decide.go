// Package adapterkit is what the transport adapters (amqpdedup, natsdedup,
// sqsdedup, kafkadedup, pubsubdedup, redisstreamdedup, lambdastreamdedup)
// share of a Consumer: the one mapping of the wrapper's answer for a
// delivery to a broker action ([Batch.Decide]), the
// one count of failures in a row and check of an outage ([Policy],
// [Outage.Failed]), the handling of a batch whose claim failed or that
// Run will not run ([Concurrent], [InOrder]), the give-up on an outage
// longer than its bound ([Guard]), and the run skeleton ([Start],
// [Run.Stop]).
// An adapter keeps only what its broker's API differs in: how it acts on a
// [Decision], how it polls, what it holds.
//
// Like every internal package it does not import the root package: a
// broker action is decided from deduptype's Result and Outcome, a Run
// reads the wrapper's outage tracker through [Wrapper] (which
// *dedup.Wrapper satisfies), and the wrapper's handling comes in as
// function values.
package adapterkit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/backoff"
	"github.com/dedupkit/dedup/internal/logattr"
)

// Action is what an adapter does with a delivery once the wrapper has
// answered for it. Every answer maps to exactly one Action.
type Action uint8

const (
	// Ack acknowledges the delivery (ack, delete, mark its offset): its
	// outcome is durable (OutcomeProcessed, OutcomeDuplicate).
	Ack Action = iota + 1
	// Park acknowledges a delivery the wrapper has parked in its
	// dead-letter sink and recorded (OutcomeDeadLettered, OutcomeConflict):
	// the letter is durable first. A broker that tells the two apart ends it
	// as such (JetStream's Term); the others acknowledge it.
	Park
	// Redeliver gives the delivery back, to be delivered again after
	// Decision.Delay (0: at once): OutcomeRetry, OutcomeInFlight, a failure
	// when the adapter has a failure backoff, and any delivery while Run is
	// stopping. Nothing is acknowledged.
	Redeliver
	// Lapse stops holding a delivery that could not be settled and leaves it
	// to come back when the broker's own timeout runs out (SQS's visibility
	// timeout): a failure when the adapter has no failure backoff.
	Lapse
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Park:
		return "park"
	case Redeliver:
		return "redeliver"
	case Lapse:
		return "lapse"
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Decision is the action one delivery calls for.
type Decision struct {
	Action Action
	// Delay is how long a Redeliver waits before the delivery comes back.
	Delay time.Duration
	// Err is why the delivery could not be settled (the store or the sink
	// failing, or Run stopping under its handler), nil otherwise.
	Err error
	// Level is the level to log Err at: WARN, or DEBUG during an outage,
	// which the wrapper logs at ERROR.
	Level slog.Level
	// Failures is how many batches in a row have had a delivery not
	// settled, as of this one, when Err is a failure that counts (not one
	// caused by Run stopping).
	Failures int
}

// Settled reports whether the delivery is to be acknowledged (Ack, Park).
func (d Decision) Settled() bool { return d.Action == Ack || d.Action == Park }

// LogFailure logs a delivery not settled, d.Err, at d.Level with msg, the
// delivery's attrs, the delay before it comes back and the error.
func (d Decision) LogFailure(ctx context.Context, log *slog.Logger, msg string, attrs ...slog.Attr) {
	if d.Action == Redeliver {
		attrs = append(attrs, logattr.Duration("retry_in", d.Delay))
	}
	attrs = append(attrs, slog.Any("error", d.Err))
	log.LogAttrs(ctx, d.Level, msg, attrs...)
}

// Unbounded is an InFlightDelay that does not shorten the wrapper's
// RetryAfter (Kafka waits it out in place).
const Unbounded = time.Duration(math.MaxInt64)

// MaxFailureDelay bounds [FailureBackoff].
const MaxFailureDelay = 15 * time.Second

// failureBackoff is FailureBackoff's one backoff, safe for concurrent use.
var failureBackoff = backoff.Exponential(time.Second, MaxFailureDelay)

// FailureBackoff is the Policy Backoff of an adapter whose broker takes a
// delivery back after a delay the adapter chooses (NATS's Nak with delay,
// Pub/Sub's hold before the nack, a Redis entry's idle time) and that
// offers no option for it: a delivery not settled because the store or the
// sink failed comes back after 1 s, doubling with each batch in a row that
// failed up to [MaxFailureDelay], jittered, so that a failing store is not
// hammered and one back is tried again within MaxFailureDelay.
func FailureBackoff(failures int) time.Duration { return failureBackoff(failures) }

// errUnknownOutcome is the failure of a result with no outcome the mapping
// knows: never acknowledged.
var errUnknownOutcome = errors.New("adapterkit: result with no known outcome")

// Policy decides the actions of the deliveries of one Run (one Kafka
// partition): it holds the adapter's delays and the count of failures in a
// row. It is safe for concurrent use by the Batches it starts.
type Policy struct {
	// InFlightDelay bounds the delay of a delivery whose event is being
	// handled elsewhere (the shorter of it and the wrapper's RetryAfter).
	InFlightDelay time.Duration
	// Backoff returns the delay of a delivery not settled by the number of
	// batches in a row with one; nil: Lapse, the broker's timeout is the
	// delay.
	Backoff func(failures int) time.Duration
	// Outage is told of each batch with a delivery not settled; nil for a
	// handler that runs under no Run (a Lambda invocation: the wrapper's
	// own tracker still logs the outage), whose failures are logged at
	// WARN and never give up.
	Outage *Outage

	failures atomic.Int64 // batches in a row with a delivery not settled
}

// Batch starts the decisions of one batch of deliveries handled together
// (one store call); stop is closed once Run is stopping. A Batch is used by
// one goroutine.
func (p *Policy) Batch(stop <-chan struct{}) *Batch { return &Batch{p: p, stop: stop} }

// Batch decides the actions of one batch's deliveries: its failures count
// once toward the failures in a row, since they are one failed store call
// (or one outage seen by each of its deliveries), and the outage is checked
// once.
type Batch struct {
	p       *Policy
	stop    <-chan struct{}
	counted bool
	n       int
	level   slog.Level
}

// Stopping reports whether Run is stopping.
func (b *Batch) Stopping() bool {
	select {
	case <-b.stop:
		return true
	default:
		return false
	}
}

// Decide returns the one action the wrapper's answer for a delivery calls
// for (res, or err when the outcome could not be made durable):
//
//   - OutcomeProcessed, OutcomeDuplicate: Ack.
//   - OutcomeDeadLettered, OutcomeConflict: Park.
//   - OutcomeRetry: Redeliver after res.RetryAfter.
//   - OutcomeInFlight: Redeliver after res.RetryAfter or the policy's
//     InFlightDelay, the shorter.
//   - err (or an outcome it does not know): not settled. While Run is
//     stopping, Redeliver at once, logged at WARN and not counted: the
//     shutdown, not an outage, left it unsettled. Otherwise the batch counts
//     once toward the failures in a row, the outage is checked (which may
//     stop Run), and the delivery is given back after the Backoff of the
//     failures in a row (Redeliver), or left to the broker's timeout
//     (Lapse) without one.
//
// Only a settled outcome (Ack, Park) ends a run of failures: its record or
// letter is durable, so the store and the sink answer again. OutcomeRetry and
// OutcomeInFlight do not: a store that records a handler's failure may still
// fail to record other deliveries (a sink down, a claim timing out), and
// resetting on them would give those deliveries back at the shortest delay
// for as long as that lasts.
func (b *Batch) Decide(res deduptype.Result, err error) Decision {
	if err != nil {
		return b.failed(err)
	}
	switch res.Outcome {
	case deduptype.OutcomeProcessed, deduptype.OutcomeDuplicate:
		b.p.failures.Store(0)
		return Decision{Action: Ack}
	case deduptype.OutcomeDeadLettered, deduptype.OutcomeConflict:
		b.p.failures.Store(0)
		return Decision{Action: Park}
	case deduptype.OutcomeInFlight:
		return Decision{Action: Redeliver, Delay: max(min(res.RetryAfter, b.p.InFlightDelay), 0)}
	case deduptype.OutcomeRetry:
		return Decision{Action: Redeliver, Delay: max(res.RetryAfter, 0)}
	}
	return b.failed(fmt.Errorf("%w: %v", errUnknownOutcome, res.Outcome))
}

// failed decides for a delivery not settled because of err.
func (b *Batch) failed(err error) Decision {
	if b.Stopping() {
		return Decision{Action: Redeliver, Err: err, Level: slog.LevelWarn}
	}
	if !b.counted {
		b.counted = true
		b.n = int(b.p.failures.Add(1))
		b.level = slog.LevelWarn
		if b.p.Outage != nil {
			b.level = b.p.Outage.Failed()
		}
	}
	d := Decision{Action: Lapse, Err: err, Level: b.level, Failures: b.n}
	if b.p.Backoff != nil {
		d.Action, d.Delay = Redeliver, max(b.p.Backoff(b.n), 0)
	}
	return d
}

// NotRun is the decision for a delivery Run will not handle because it is
// stopping: given back at once.
func NotRun() Decision { return Decision{Action: Redeliver} }
