package dedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/dedupkit/dedup/internal/logattr"
)

// attempt is one acquired claim on its way to an outcome. Each way of
// claiming has one implementation: a store claim with a lease
// (storeAttempt), a transaction of its own (the transactional inbox's
// txAttempt), a place in a batch's shared transaction (inboxChunk's
// chunkAttempt), and a handler's verdict already known, settled on the
// store path (verdictAttempt). [Wrapper.settle] is the one routine around them that
// decides what an attempt's outcome is and in which order it is made
// durable; it never asks which kind it holds.
type attempt[M any] interface {
	// run runs the handler on d's message, keeping the claim meanwhile.
	run(ctx context.Context, d *delivery[M]) error
	// hold makes sure the claim is still d's, for as long as a lease, or
	// returns an error matching ErrLeaseLost. An attempt in a batch's
	// shared transaction may instead leave the step that needs the hold
	// (a dead letter) to the batch, as fail may leave the failure's write:
	// see left.
	hold(ctx context.Context, d *delivery[M]) error
	// complete records the attempt's success, with d.result, its effects
	// committed (or, when d.result stands alone and they cannot commit,
	// undone); retried says that an earlier try may have been applied, its
	// answer lost.
	complete(ctx context.Context, d *delivery[M], retried bool) error
	// fail records the attempt's failure, the handler's effects undone where
	// the attempt can, and returns the attempts recorded.
	fail(ctx context.Context, d *delivery[M], f Failure, retried bool) (int, error)
	// end lets go of whatever the attempt still holds.
	end(ctx context.Context, d *delivery[M])
	// left reports whether the attempt left the step settle last asked of
	// it (hold or fail) to the batch that holds it, the inbox's shared
	// transaction, which takes it once settle returns.
	left() bool
}

// claimer claims one delivery's key, as req asks, for an attempt of its
// own: the store's Claim, or the inbox's transaction.
type claimer[M any] interface {
	claim(ctx context.Context, req ClaimRequest) (Claim, attempt[M], error)
}

// unrepeatable marks a settling write's error that trying again cannot mend.
type unrepeatable struct{ error }

func (e unrepeatable) Unwrap() error { return e.error }

// sharedFate marks the failure of a write that carried the handler's effects
// in its own transaction: whatever became of the outcome became of the
// effects, so no effect stays applied unrecorded.
type sharedFate struct{ error }

func (e sharedFate) Unwrap() error { return e.error }

// handlerFault marks an error the handler caused, not the store: it
// returned nil in a transaction a failed statement aborted, it ended the
// transaction dedup ends, its writes broke a deferred constraint. The
// outage tracker does not count it.
type handlerFault struct{ error }

func (e handlerFault) Unwrap() error { return e.error }

// storeAttempt is an attempt on the store claim path: a claim with a lease,
// extended while the handler runs, and fenced writes on its owner token.
type storeAttempt[M any] struct{ w *Wrapper[M] }

func (s storeAttempt[M]) claim(ctx context.Context, req ClaimRequest) (Claim, attempt[M], error) {
	// A store's error names its package, operation and key already.
	c, err := s.w.store.Claim(ctx, req)
	return c, s, err
}

// run runs the handler with a heartbeat: a lost lease cancels it.
func (s storeAttempt[M]) run(ctx context.Context, d *delivery[M]) (err error) {
	hctx, cancel := context.WithCancelCause(ctx)
	hb := s.w.heartbeats.Get().(*heartbeat)
	hb.start(hctx, s.w.detached, cancel, d.key, d.owner, d.leaseTime)
	defer func() {
		hb.stop()
		s.w.heartbeats.Put(hb)
		cancel(nil)
	}()
	defer capturePanic(&err)
	return s.w.handler(hctx, d.msg)
}

// hold renews the lease: a refusal means another worker took the key over.
func (s storeAttempt[M]) hold(ctx context.Context, d *delivery[M]) error {
	return s.w.store.Extend(ctx, d.key, d.owner, d.leaseTime)
}

func (s storeAttempt[M]) complete(ctx context.Context, d *delivery[M], retried bool) error {
	return completeFenced(ctx, s.w.store, d.key, d.owner, d.result.bytes(), s.w.cfg.ttl, retried)
}

// fail returns the claim's attempt count: the write is fenced on the claim,
// so no other attempt was counted since.
func (s storeAttempt[M]) fail(ctx context.Context, d *delivery[M], f Failure, retried bool) (int, error) {
	return d.attempts, failFenced(ctx, s.w.store, d.key, d.owner, f, retried)
}

func (s storeAttempt[M]) end(context.Context, *delivery[M]) {}

func (s storeAttempt[M]) left() bool { return false }

// completeFenced completes the claim of key by owner; a refusal after an
// earlier try (retried) counts as done when that try landed.
func completeFenced(ctx context.Context, store Store, key Key, owner string, result []byte, ttl time.Duration, retried bool) error {
	return forgiveLanded(ctx, store, key, owner, retried, store.Complete(ctx, key, owner, result, ttl))
}

// failFenced records a failure of the claim of key by owner, as
// completeFenced completes it.
func failFenced(ctx context.Context, store Store, key Key, owner string, f Failure, retried bool) error {
	return forgiveLanded(ctx, store, key, owner, retried, store.Fail(ctx, key, owner, f))
}

// forgiveLanded returns err, the answer of a settling write of the claim of
// key by owner, or nil when it is a refusal (ErrLeaseLost) after an earlier
// try (retried) that landed: that try was applied but its answer lost.
func forgiveLanded(ctx context.Context, store Store, key Key, owner string, retried bool, err error) error {
	if retried && errors.Is(err, ErrLeaseLost) && landed(ctx, store, key, owner) {
		return nil
	}
	return err
}

// landed reports whether the record of key was settled by owner: still its
// token, no longer processing. Only owner settles its own claim, and a
// takeover replaces the token.
func landed(ctx context.Context, store Store, key Key, owner string) bool {
	if owner == "" {
		return false
	}
	rec, err := store.Get(ctx, key)
	return err == nil && rec.Owner == owner && rec.Status != StatusProcessing
}

// settle carries one claimed delivery through its attempt: it answers a
// claim that was not acquired, parks an event whose attempts are exhausted,
// runs the handler with a heartbeat and panic recovery, and records the
// outcome.
func (w *Wrapper[M]) settle(ctx context.Context, d *delivery[M], c Claim, att attempt[M]) (Result, error) {
	res := Result{Key: d.key, Attempts: c.Record.Attempts}
	switch acquired, err := claimAcquired(d.key, c); {
	case err != nil:
		if att != nil {
			att.end(ctx, d)
		}
		return res, err
	case acquired:
	case c.Status == ClaimInFlight:
		res.Outcome = OutcomeInFlight
		res.RetryAfter = clamp(time.Until(c.Record.LeaseUntil), 100*time.Millisecond, min(d.leaseTime, maxInFlightWait))
		return res, nil
	case c.Status == ClaimConflict:
		return w.parkConflict(ctx, d, c.Record)
	case c.Status == ClaimFinal:
		return w.answerFinal(ctx, d, c.Record)
	default: // ClaimDuplicate
		res.Outcome = OutcomeDuplicate
		return res, nil
	}
	d.att, d.owner, d.attempts, d.locator = att, c.Record.Owner, c.Record.Attempts, c.Locator
	defer att.end(ctx, d)

	if c.Record.Attempts > w.cfg.maxAttempts {
		// The last attempt never reached a verdict (its worker died) or its
		// dead letter could not be written: park it now without running.
		// With no failure ever recorded, every attempt ended in a death, even
		// when the claim was given back since (a batch releasing it).
		reason := ReasonHandlerError
		if c.Previous == StatusProcessing || c.Record.LastError == "" {
			reason = ReasonCrashLoop
		}
		cause := errors.New(orDefault(c.Record.LastError, "attempts exhausted without a recorded error"))
		sctx, cancel := w.settleCtx(ctx, settleTimeout)
		defer cancel()
		return w.parkFinal(sctx, d, c.Record, reason, cause)
	}

	err := w.run(ctx, d)
	if err == nil && ctx.Err() != nil {
		w.warnNilAfterCancel(d.key)
	}
	sctx, cancel := w.settleCtx(ctx, settleTimeout)
	defer cancel()
	if err == nil {
		if err := w.complete(sctx, d); err != nil {
			return res, w.settleError("complete", d.key, err, true)
		}
		res.Outcome = OutcomeProcessed
		return res, nil
	}
	res, serr := w.afterFailure(sctx, d, c.Record, err)
	if serr == nil && ctx.Err() != nil {
		// Shutting down: the attempt is recorded, the caller must not ack.
		return res, err
	}
	return res, serr
}

// answerFinal answers a delivery of an event whose record, rec, is
// FAILED_FINAL, never by dropping it unsaid. A message carrying dedup's
// dead-letter metadata is a letter moved back to its origin by hand (a
// shovel, a console): it is dead-lettered again, with
// ReasonRedeliveredAfterFinal, without running and with rec left as it is,
// so that the letter is not lost. Any other copy (the broker redelivering
// it after the final write, its acknowledgement lost; a producer sending
// the event again) has its letter already, written before the final write:
// it is acknowledged as a duplicate. Either way a WARN names the key and the
// command that makes the event claimable again.
func (w *Wrapper[M]) answerFinal(ctx context.Context, d *delivery[M], rec Record) (Result, error) {
	release := releaseCommand(d.key)
	if !hasLetterMetadata(w.carrier(d.msg)) {
		w.cfg.logger.Warn("dedup: event already dead-lettered; this copy is acknowledged without running",
			slog.Any("key", d.key), w.origin(d), slog.String("release", release))
		return Result{Outcome: OutcomeDuplicate, Key: d.key, Attempts: rec.Attempts}, nil
	}
	cause := fmt.Errorf("dedup: %s was dead-lettered and is failed for good; its letter came back to its origin and is parked again: release the event first (%s): %w",
		d.key, release, errors.New(orDefault(rec.LastError, "failed for good")))
	if err := w.park(ctx, d, ReasonRedeliveredAfterFinal, cause, rec); err != nil {
		return Result{Key: d.key}, err
	}
	w.cfg.logger.Warn("dedup: a dead letter came back to its origin while its event is failed for good; dead-lettered again without running",
		slog.Any("key", d.key), w.origin(d), slog.String("release", release))
	return Result{Outcome: OutcomeDeadLettered, Key: d.key, Attempts: rec.Attempts, Reason: ReasonRedeliveredAfterFinal, Err: cause}, nil
}

// hasLetterMetadata reports whether a message whose headers are c carries
// dedup's dead-letter metadata: a name starting with [MetadataPrefix]
// (dedup-reason; SQS's packed dedup-metadata).
func hasLetterMetadata(c propagation.TextMapCarrier) bool {
	if c == nil {
		return false
	}
	for _, k := range c.Keys() {
		if strings.HasPrefix(k, MetadataPrefix) {
			return true
		}
	}
	return false
}

// releaseCommand returns the command of the dedup CLI that makes key
// claimable again, its scope and ID quoted for a shell where they need it.
func releaseCommand(key Key) string {
	return "dedup release -scope " + shellQuote(key.Scope) + " -id " + shellQuote(key.EventID) + " -yes"
}

// shellQuote returns s as one word of a POSIX shell: as it is when every
// character is plain, else in single quotes.
func shellQuote(s string) string {
	plain := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=@%+,", r))
	}) < 0
	if plain {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// claimAcquired sorts c, the answer to a claim of key: acquired, or a
// status whose answer is the caller's (ClaimDuplicate, ClaimInFlight,
// ClaimConflict, ClaimFinal). Any other status is an error, and the caller
// ends the attempt the claim came with, if any.
func claimAcquired(key Key, c Claim) (bool, error) {
	switch c.Status {
	case ClaimAcquired:
		return true, nil
	case ClaimDuplicate, ClaimInFlight, ClaimConflict, ClaimFinal:
		return false, nil
	}
	return false, fmt.Errorf("dedup: claim %s: unknown claim status %v", key, c.Status)
}

// run runs the handler of a held claim through its attempt, within the
// delivery's span.
func (w *Wrapper[M]) run(ctx context.Context, d *delivery[M]) error {
	if w.tel != nil {
		if d.span != nil {
			ctx = trace.ContextWithSpan(ctx, d.span)
		}
		defer w.tel.handled(ctx, time.Now())
	}
	return d.att.run(ctx, d)
}

// afterFailure decides between retry and dead letter after a failed attempt
// and records it.
func (w *Wrapper[M]) afterFailure(ctx context.Context, d *delivery[M], rec Record, herr error) (Result, error) {
	attempts := rec.Attempts
	if w.msgs.Attempts != nil {
		attempts = max(attempts, w.msgs.Attempts(d.msg))
	}
	reason := ReasonHandlerError
	var perr *PanicError
	switch {
	case IsPermanent(herr):
		reason = ReasonPermanent
	case errors.As(herr, &perr):
		reason = ReasonPanic
	}
	if reason == ReasonPermanent || attempts >= w.cfg.maxAttempts {
		rec.Attempts = attempts
		return w.parkFinal(ctx, d, rec, reason, herr)
	}
	recorded, err := w.fail(ctx, d, Failure{Error: herr.Error(), TTL: w.cfg.ttl})
	switch {
	case err != nil:
		return Result{Key: d.key}, w.settleError("record failure", d.key, err, false)
	case d.att.left():
		return Result{Key: d.key}, nil // the batch holding the attempt records it
	}
	attempts = max(attempts, recorded)
	if w.cfg.logger.Enabled(ctx, slog.LevelDebug) {
		w.cfg.logger.LogAttrs(ctx, slog.LevelDebug, "dedup: attempt failed, will retry", slog.Any("key", d.key), w.origin(d),
			slog.Int("attempt", attempts), slog.Any("error", herr))
	}
	return Result{Outcome: OutcomeRetry, Key: d.key, Attempts: attempts, Err: herr,
		RetryAfter: w.cfg.backoff(attempts)}, nil
}

// parkFinal dead-letters a held event and records it as failed for good.
//
// The order is what makes it safe. First hold: a worker that lost its claim
// (it froze, its lease lapsed, another worker took the event over and may
// have completed it) learns it here and writes nothing. Then the letter:
// if the sink fails, the record stays retryable and the message comes back,
// so a letter is never lost. Then the final write, fenced on the claim. hold
// renewed the lease for its whole length and the sink write is bounded by
// it, so another worker can take the event over between the steps only if
// the sink accepted the letter past its deadline: the final write is then
// refused and reported, and the letter carries the event ID by which
// whoever drains the dead letters finds the event settled.
func (w *Wrapper[M]) parkFinal(ctx context.Context, d *delivery[M], rec Record, reason Reason, cause error) (Result, error) {
	err := w.retryHeld(ctx, d.leaseTime, func(ctx context.Context, _ bool) error { return d.att.hold(ctx, d) })
	switch {
	case err != nil:
		return Result{Key: d.key}, w.settleError("dead-letter", d.key, err, false)
	case d.att.left():
		return Result{Key: d.key}, nil // the batch holding the attempt parks it
	}
	pctx, cancel := context.WithTimeout(ctx, d.leaseTime)
	err = w.park(pctx, d, reason, cause, rec)
	cancel()
	if err != nil {
		if _, ferr := w.fail(ctx, d, Failure{Error: cause.Error(), TTL: w.cfg.ttl}); ferr != nil {
			err = errors.Join(err, ferr)
		}
		return Result{Key: d.key}, err
	}
	if _, err := w.fail(ctx, d, Failure{Final: true, Error: cause.Error(), TTL: w.cfg.ttl}); err != nil {
		return Result{Key: d.key}, w.settleError("record dead letter", d.key, err, false)
	}
	return Result{Outcome: OutcomeDeadLettered, Key: d.key, Attempts: rec.Attempts, Reason: reason, Err: cause}, nil
}

// complete records d's success, trying again for up to outcomeLeases
// leases.
func (w *Wrapper[M]) complete(ctx context.Context, d *delivery[M]) error {
	return w.retryHeld(ctx, outcomeLeases*d.leaseTime, func(ctx context.Context, retried bool) error {
		return d.att.complete(ctx, d, retried)
	})
}

// fail records a failed attempt, trying again while the claim holds.
func (w *Wrapper[M]) fail(ctx context.Context, d *delivery[M], f Failure) (int, error) {
	var attempts int
	err := w.retryHeld(ctx, d.leaseTime, func(ctx context.Context, retried bool) error {
		var err error
		attempts, err = d.att.fail(ctx, d, f, retried)
		return err
	})
	return attempts, err
}

// Bounds of the waits between tries of a settling write.
const (
	settleRetryMin = 50 * time.Millisecond
	settleRetryMax = time.Second
)

// outcomeLeases bounds, in leases, how long the completion of a handler that
// succeeded is tried again. Past the lease, the claim may lapse, but the
// completion is still the right write as long as nobody has taken the claim
// over: the store's fencing on the owner token refuses it once somebody
// has. Giving up instead would leave the effect to run again at the next
// delivery. The delivery's context bounds it first: a transport cancels it
// once it may give the message to another consumer (the Kafka partition
// revoked, the SQS consumer shutting down).
const outcomeLeases = 10

// retryHeld makes write, a write that records the outcome of attempts that
// ran, trying it again after an error while ctx lasts, for up to bound: a
// failure for a blip of the store would leave the effect to be redone. An
// ErrLeaseLost or an unrepeatable error ends it. retried tells write
// whether an earlier try may have been applied. Each failed try is fed to
// w's outage tracker, so that Health reports an outage that a long retry
// sits out.
func (w *Wrapper[M]) retryHeld(ctx context.Context, bound time.Duration, write func(ctx context.Context, retried bool) error) error {
	var deadline time.Time // from the first failure: a write that succeeds reads no clock
	wait := settleRetryMin
	for tries := 1; ; tries++ {
		err := write(ctx, tries > 1)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrLeaseLost) || isUnrepeatable(err):
			return err
		}
		if tries == 1 {
			deadline = time.Now().Add(bound)
		}
		if ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		w.health.Failure(err)
		if tries == 1 {
			w.cfg.logger.Warn("dedup: outcome not recorded; retrying it while the delivery is held",
				logattr.Duration("for_up_to", time.Until(deadline).Round(time.Millisecond)), slog.Any("error", err))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, settleRetryMax)
	}
}

// isUnrepeatable reports whether err says that trying its write again
// cannot succeed. Kept out of retryHeld's loop so that the target of
// errors.As escapes to the heap only when a write failed.
func isUnrepeatable(err error) bool {
	var final unrepeatable
	return errors.As(err, &final)
}

// settleError reports a write that could not record an attempt's outcome.
// applied says whether the attempt's effect stays applied (it succeeded):
// then a lost claim means that another worker will apply it again, and an
// unrecorded outcome that the next delivery will.
func (w *Wrapper[M]) settleError(op string, key Key, err error, applied bool) error {
	lost := errors.Is(err, ErrLeaseLost)
	if lost {
		w.tel.leaseLost(context.Background())
	}
	switch {
	case !lost && applied && !errors.As(err, new(sharedFate)):
		w.tel.outcomeUnrecorded(context.Background())
		w.cfg.logger.Error("dedup: outcome not recorded after the handler succeeded; its effect may run again when the event is redelivered",
			slog.Any("key", key), slog.String("op", op), slog.Any("error", err))
	case !lost:
	case applied:
		w.cfg.logger.Error("dedup: lease lost: another worker took this event over while it ran; its effect may be applied twice",
			slog.Any("key", key), slog.String("op", op))
	default:
		w.cfg.logger.Warn("dedup: lease lost: another worker took this event over; this attempt's failure is not recorded",
			slog.Any("key", key), slog.String("op", op))
	}
	return err // the store's error names its operation and key already
}
