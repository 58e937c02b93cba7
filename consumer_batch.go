package dedup

import (
	"context"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/attribute"
)

// HandleBatch processes msgs in order, claiming all their keys in one store
// call first, and calls yield with each message's index and result, in
// order, as soon as it is settled; with batch completion (the default, see
// [WithBatchCompletion]), a success is given to yield once its completion,
// written with others, is durable. When yield returns false, or ctx is done,
// it stops and gives back the claims of the messages not yet run; the
// settled results written together with the one yield stopped at are still
// given to it, up to the first result that is not settled. It returns an
// error, having processed nothing, only when the batch claim itself fails;
// a later claim that fails (a segment's, see below) is the error of each
// message from the first it claims, for as long as yield asks for more.
//
// A key the batch holds more than once is sent to the store once: a later
// copy gets its answer from the first copy's outcome (OutcomeDuplicate once
// that is settled, the same OutcomeRetry or OutcomeInFlight otherwise), or,
// when its payload differs or it is a dead letter moved back to its origin
// while the first copy is not, from a claim of its own made after the first
// copy settled.
func (w *Wrapper[M]) HandleBatch(ctx context.Context, msgs []M, yield func(i int, res Result, err error) bool, opts ...CallOpt) error {
	call := callOptions(opts)
	b := w.newBatch(ctx, msgs, &call, w.runner)
	defer w.releaseBatch(b)
	if w.tel != nil {
		defer b.endSpans()
	}
	b.yield, b.stop = yield, call.stop
	return b.run(ctx)
}

// prepared are the deliveries of a batch and the copies of a key among them.
type prepared[M any] struct {
	ds []delivery[M]
	// first is, per delivery, the index of the batch's first copy of its key
	// when it is a later copy, else -1.
	first []int
	// movedBack marks a later copy that carries dedup's dead-letter metadata
	// while its first copy does not: a letter moved back by hand, which a
	// record failed for good answers otherwise (see answerFinal).
	movedBack []bool
	keys      map[Key]int // the first copy of each key; kept for reuse
}

// prepareBatch prepares the deliveries of msgs into p, reusing its slices.
func (w *Wrapper[M]) prepareBatch(ctx context.Context, msgs []M, call *callConfig, p *prepared[M]) {
	p.ds, p.first, p.movedBack = grow(p.ds, len(msgs)), grow(p.first, len(msgs)), grow(p.movedBack, len(msgs))
	for i, m := range msgs {
		p.ds[i] = w.prepare(ctx, m, call)
		p.first[i], p.movedBack[i] = -1, false
		if p.ds[i].bad != "" || len(msgs) == 1 {
			continue
		}
		if p.keys == nil {
			p.keys = make(map[Key]int, len(msgs))
		}
		if f, ok := p.keys[p.ds[i].key]; ok {
			p.first[i] = f
			p.movedBack[i] = hasLetterMetadata(w.carrier(m)) && !hasLetterMetadata(w.carrier(msgs[f]))
		} else {
			p.keys[p.ds[i].key] = i
		}
	}
}

// grow returns s resliced to n elements, reallocated when its capacity is
// short. The elements are zero: releaseBatch clears what it keeps.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// maxPooledBatch is the largest batch whose slices are kept for the next
// HandleBatch: a transport's batches are about the same size from call to
// call, and an outsized one should not pin its memory.
const maxPooledBatch = 4096

// newBatch returns a batch of msgs run by runner, its deliveries prepared,
// with the slices of an earlier one when there is one to reuse: a Kafka
// consumer calls HandleBatch per fetched partition, and allocating these per
// call cost as much as the store's claim.
func (w *Wrapper[M]) newBatch(ctx context.Context, msgs []M, call *callConfig, runner func(*batch[M]) batchRunner[M]) *batch[M] {
	b, _ := w.batches.Get().(*batch[M])
	if b == nil {
		b = &batch[M]{w: w}
	}
	n := len(msgs)
	b.outcomes, b.pending = grow(b.outcomes, n), b.pending[:0]
	w.prepareBatch(ctx, msgs, call, &b.prepared)
	b.ctx = ctx
	b.done, b.r = w.newCompleter(b), runner(b)
	return b
}

// releaseBatch stops b's completer and keeps b's slices for a later call,
// once nothing of the call it served can be reached from them.
func (w *Wrapper[M]) releaseBatch(b *batch[M]) {
	b.done.stop()
	if cap(b.ds) > maxPooledBatch {
		return
	}
	clear(b.ds[:cap(b.ds)])
	clear(b.outcomes[:cap(b.outcomes)])
	clear(b.keys)
	clear(b.reqs[:cap(b.reqs)])
	b.queue.reset()
	b.ctx, b.r, b.done, b.apart, b.yield, b.stop, b.atOnce = nil, nil, nil, nil, nil, nil, false
	w.batches.Put(b)
}

// batchRunner is where the claims and commits of a batch fall: the store
// claim path claims a batch's keys in one call (storeRunner), the
// transactional inbox runs them in shared transactions (inboxChunk), or
// each event has an attempt of its own (eachRunner). The batch's loop
// ([batch.run]) owns the rest: bad input, the copies of a key, completion
// (its completer), the order of the results, stopping.
//
// The loop cuts the batch into segments, each opened, its deliveries settled
// (in order, or at once for HandleConcurrent) and closed.
type batchRunner[M any] interface {
	// open claims the deliveries of a segment beginning at from and returns
	// its end, at most [batch.segmentEnd]'s.
	open(ctx context.Context, from int) (to int, err error)
	// settle settles delivery i of the open segment, one the segment
	// claims. It returns redo when the segment's results are to be
	// discarded and the segment opened again from its beginning; the runner
	// noted what the next run of the segment must do differently. It
	// returns afterClose when the delivery's outcome is to be settled once
	// the segment closed: the runner is then a [deferringRunner]. A runner
	// that may answer either is not run at once.
	settle(ctx context.Context, i int) (pendingResult, next)
	// settled is told of each result of a segment settled in order; it
	// returns false when yield asked to stop.
	settled(ctx context.Context, p pendingResult) bool
	// close makes the segment's results durable, for the loop to give them
	// to yield: carryOn, or redo.
	close(ctx context.Context) next
	// abandon gives back what the open segment holds from delivery i on,
	// for the batch to stop there; the loop then gives yield what is
	// durable. It returns the delivery from which the segment's results
	// stand no more (i, or its beginning when it was rolled back), and
	// false when the segment cannot stop before its end.
	abandon(ctx context.Context, i int) (from int, ok bool)
}

// next is what the batch's loop does after a step of a segment.
type next int

const (
	carryOn    next = iota // go on
	stopBatch              // yield asked to stop, or the batch cannot go on
	redo                   // open the segment again; the runner marked what runs apart
	afterClose             // the delivery is settled once its segment closed
)

// deferringRunner is a runner whose settle may answer afterClose: the
// transactional inbox's segment, which commits an event to be dead-lettered
// as a leased claim, for its letter to follow on the store claim path.
type deferringRunner interface {
	// deferred returns the claim that delivery i, left for after its
	// segment closed, holds now, and its handler's verdict (nil when it
	// did not run).
	deferred(i int) (c Claim, verdict error)
}

// batch is the progress of one HandleBatch or HandleConcurrent.
type batch[M any] struct {
	w *Wrapper[M]
	// ctx is the call's, for the writes of its completer's timer.
	ctx  context.Context
	r    batchRunner[M]
	done completer[M]
	prepared[M]
	// atOnce runs each segment's handlers at the same time
	// (HandleConcurrent), rather than in order.
	atOnce bool
	// apart marks the deliveries a runner took out of its segments: each
	// runs in a segment of its own, on the claimer's path. nil: none.
	apart []bool
	// outcomes are the results of the deliveries run so far.
	outcomes []pendingResult
	yield    func(i int, res Result, err error) bool
	stop     <-chan struct{} // CallStop's; nil: none
	// pending are the deliveries whose outcomes are not yet given to
	// yield, in order.
	pending []int
	// reqs is the runners' claim buffer and queue the batched completer,
	// kept with the batch for reuse.
	reqs  []ClaimRequest
	queue batchedCompleter[M]
}

type pendingResult struct {
	i   int
	res Result
	err error
	// on is the delivery whose success's completion the result stands on
	// (its own, or its first copy's), or -1.
	on  int
	dup bool // a later copy answered from its first
	// later is set on a result to be settled once its segment closed, and
	// on its copies.
	later bool
}

// run is the one loop that settles a batch, segment by segment. It returns
// an error, having given yield nothing, only when the first segment's claim
// fails.
func (b *batch[M]) run(ctx context.Context) error {
	for from := 0; from < len(b.ds); {
		if b.stopping(ctx) {
			if from > 0 {
				b.r.abandon(ctx, from) // gives back a claim set aside for the next segment
			}
			b.flush(ctx)
			return nil
		}
		to, err := b.r.open(ctx, from)
		if err != nil {
			if from == 0 {
				b.w.observeOutcome(ctx, err)
				return err
			}
			b.failFrom(ctx, from, err)
			return nil
		}
		mark := len(b.pending)
		step := carryOn
		if b.atOnce {
			b.settleAtOnce(ctx, from, to)
		} else {
			step = b.settleInOrder(ctx, from, to)
		}
		if step == carryOn {
			step = b.r.close(ctx)
		}
		if step == carryOn {
			b.settleDeferred(ctx, from, to)
		}
		switch step {
		case stopBatch:
			b.flush(ctx) // what is durable, up to where the batch stopped
			return nil
		case redo:
			b.pending = b.pending[:mark]
		case carryOn:
			if !b.flush(ctx) {
				b.r.abandon(ctx, to) // a key taken over, set aside for its own segment
				return nil
			}
			from = to
		}
	}
	return nil
}

// settleInOrder settles the deliveries [from, to) of the open segment one
// after the other, giving yield what it may have on the way.
func (b *batch[M]) settleInOrder(ctx context.Context, from, to int) next {
	for i := from; i < to; i++ {
		if i > from && b.stopping(ctx) {
			if kept, ok := b.r.abandon(ctx, i); ok {
				b.dropFrom(kept)
				return stopBatch
			}
		}
		p, step := b.result(ctx, i)
		if step == redo {
			return redo
		}
		b.outcomes[i] = p
		b.pending = append(b.pending, i)
		if p.later {
			continue
		}
		if !b.r.settled(ctx, p) {
			b.r.abandon(ctx, i+1)
			return stopBatch
		}
	}
	return carryOn
}

// settleAtOnce settles the deliveries [from, to) of the open segment at
// the same time, each in a goroutine of its own (the completer writes the
// successes queued meanwhile as they are due); then the later copies, from
// their first copies' outcomes.
func (b *batch[M]) settleAtOnce(ctx context.Context, from, to int) {
	var wg sync.WaitGroup
	for i := from; i < to; i++ {
		if b.claims(i) || b.ds[i].bad != "" {
			wg.Go(func() { b.outcomes[i], _ = b.result(ctx, i) })
		}
	}
	wg.Wait()
	for i := from; i < to; i++ {
		if !b.claims(i) && b.ds[i].bad == "" {
			b.outcomes[i], _ = b.result(ctx, i)
		}
		b.pending = append(b.pending, i)
	}
}

// dropFrom takes the results of the deliveries from i on out of those
// pending: their segment gave them back.
func (b *batch[M]) dropFrom(i int) {
	b.pending = slices.DeleteFunc(b.pending, func(j int) bool { return j >= i })
}

// settleDeferred settles, once the segment [from, to) closed, the
// deliveries it left for then: each on the store claim path with its
// handler's verdict, fenced on the claim its segment committed; then
// their copies, from their outcomes.
func (b *batch[M]) settleDeferred(ctx context.Context, from, to int) {
	for i := from; i < to; i++ {
		if !b.outcomes[i].later {
			continue
		}
		if !b.claims(i) {
			b.outcomes[i] = b.copyOf(i)
			continue
		}
		c, verdict := b.r.(deferringRunner).deferred(i)
		att := verdictAttempt[M]{storeAttempt: storeAttempt[M]{b.w}, verdict: verdict}
		p := pendingResult{i: i, on: -1}
		p.res, p.err = b.w.settle(ctx, &b.ds[i], c, att)
		b.outcomes[i] = p
	}
}

// failFrom gives err, a failed claim, as the result of each delivery from
// from on, for as long as yield asks for more.
func (b *batch[M]) failFrom(ctx context.Context, from int, err error) {
	for i := from; i < len(b.ds); i++ {
		res := Result{Key: b.ds[i].key}
		b.w.observe(ctx, &b.ds[i], res, err)
		if !b.yield(i, res, err) {
			return
		}
	}
}

// result settles delivery i: bad input is dead-lettered (once, however
// often its segment runs, as is any letter that writes no record), a later
// copy with the same payload is answered from its first, and the runner
// settles the rest, or leaves it (and its copies) for
// [batch.settleDeferred], marked later.
func (b *batch[M]) result(ctx context.Context, i int) (pendingResult, next) {
	d := &b.ds[i]
	switch {
	case d.bad != "":
		if p := b.outcomes[i]; p.res.Outcome != 0 {
			return p, carryOn
		}
		p := pendingResult{i: i, on: -1}
		p.res, p.err = b.w.parkBad(ctx, d)
		return p, carryOn
	case !b.claims(i):
		return b.copyOf(i), carryOn
	case letteredAlone(b.outcomes[i]):
		return b.outcomes[i], carryOn
	}
	p, step := b.r.settle(ctx, i)
	if p.err == nil && p.res.Outcome == OutcomeProcessed {
		p.on = i
	}
	p.later = step == afterClose
	return p, step
}

// letteredAlone reports whether p, a delivery's result on an earlier run of
// its segment (rolled back since, to be run again), is a dead letter sent
// without writing the record (a fingerprint conflict, a letter moved back
// after its event's final failure): the letter stands whatever became of
// the segment's transaction, and is not sent again.
func letteredAlone(p pendingResult) bool {
	return p.err == nil && (p.res.Reason == ReasonConflict || p.res.Reason == ReasonRedeliveredAfterFinal)
}

// claims reports whether delivery i is claimed: the batch's first copy of
// its key, or a later copy with another payload or moved back, which the
// store must judge against the first's settled record.
func (b *batch[M]) claims(i int) bool {
	return b.ds[i].bad == "" && (b.first[i] < 0 || b.ds[i].fp != b.ds[b.first[i]].fp || b.movedBack[i])
}

// segmentEnd returns the end of a segment beginning at from, of at most max
// deliveries: a delivery marked apart is a segment of its own, and a segment
// claims a key once, so that a later copy with another payload is judged
// against its first's settled record.
func (b *batch[M]) segmentEnd(from, max int) int {
	if b.apart != nil && b.apart[from] {
		return from + 1
	}
	to := min(len(b.ds), from+max)
	for i := from; i < to; i++ {
		if b.apart != nil && b.apart[i] {
			return i
		}
		if b.claims(i) && b.first[i] >= 0 && b.claimedSince(from, i) {
			return i
		}
	}
	return to
}

// claimedSince reports whether a delivery in [from, i) claims the key of
// delivery i, a later copy.
func (b *batch[M]) claimedSince(from, i int) bool {
	f := b.first[i]
	for j := max(from, f); j < i; j++ {
		if (j == f || b.first[j] == f) && b.claims(j) {
			return true
		}
	}
	return false
}

// setApart marks delivery i to run in a segment of its own.
func (b *batch[M]) setApart(i int) {
	if b.apart == nil {
		b.apart = make([]bool, len(b.ds))
	}
	b.apart[i] = true
}

// stopping reports whether the transport asked the batch to stop, or its
// context is done.
func (b *batch[M]) stopping(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	select {
	case <-b.stop:
		return true
	default:
		return false
	}
}

// endSpans ends the spans of the deliveries given no result: the batch
// stopped before them (a failed claim, a cancelled context, yield asking to
// stop), and they come back.
func (b *batch[M]) endSpans() {
	for i := range b.ds {
		if span := b.ds[i].span; span != nil {
			span.SetAttributes(attribute.String("dedup.outcome", "unsettled"))
			span.End()
		}
	}
}

// copyOf answers delivery i, a later copy of a key with the same payload,
// from the outcome of the key's first copy, without asking the store; a
// duplicate of a success waiting to be completed waits for that completion.
func (b *batch[M]) copyOf(i int) pendingResult {
	f := b.outcomes[b.first[i]]
	p := pendingResult{i: i, on: -1, err: f.err, res: copyResult(f.res), dup: true, later: f.later}
	if p.res.Outcome == OutcomeDuplicate {
		p.on = f.on
	}
	return p
}

// copyResult is the one rule for a later copy of a key in a batch, with the
// same payload as the first: once the first settled, a duplicate of it;
// otherwise the first's own answer (OutcomeRetry or OutcomeInFlight), so that
// the copy comes back too.
func copyResult(first Result) Result {
	switch first.Outcome {
	case OutcomeProcessed, OutcomeDeadLettered, OutcomeDuplicate, OutcomeConflict:
		return Result{Outcome: OutcomeDuplicate, Key: first.Key, Attempts: first.Attempts}
	}
	return first
}

// settled gives the results so far to yield when p cannot wait for the
// successes queued before it (it is not settled) or they are due; it
// returns false when yield asked to stop.
func (b *batch[M]) settled(ctx context.Context, p pendingResult) bool {
	if p.err != nil || !p.res.Settled() || b.done.due() {
		return b.flush(ctx)
	}
	return true
}

// flush writes the successes queued, then gives the pending results to
// yield; it returns false when yield asked to stop.
func (b *batch[M]) flush(ctx context.Context) bool {
	b.done.flush(ctx)
	return b.give(ctx)
}

// give gives the pending results to yield in order, each success whose
// completion failed turned into its error. Once yield asked to stop at a
// settled result, it still gives the settled results that follow, which ran
// and are durable, up to the first that is not, so that a transport
// stopping acknowledges what is done; yield stopping at an unsettled result
// gets nothing more. It returns false when yield asked to stop.
func (b *batch[M]) give(ctx context.Context) bool {
	w := b.w
	pending := b.pending
	b.pending = b.pending[:0]
	stopped, durable := false, false
	defer func() {
		if durable {
			w.health.Stamp()
		}
	}()
	// Every failed completion is reported, also those past where yield
	// stops: a lost lease is a possible repeat whatever the transport does.
	for _, i := range pending {
		p := &b.outcomes[i]
		if p.on < 0 {
			continue
		}
		if cerr := b.done.err(p.on); cerr != nil {
			p.res.Outcome = 0
			p.err = w.settleError("complete", p.res.Key, cerr, !p.dup)
		}
		p.on = -1
	}
	for _, i := range pending {
		p := b.outcomes[i]
		if stopped && (p.err != nil || !p.res.Settled()) {
			break
		}
		durable = w.observe(ctx, &b.ds[p.i], p.res, p.err) || durable
		if !b.yield(p.i, p.res, p.err) {
			stopped = true
			if p.err != nil || !p.res.Settled() {
				break // what follows an unsettled result must not be acknowledged past it
			}
		}
	}
	return !stopped
}

// eachRunner gives each event of a batch an attempt of its own, claimed
// when it runs: the transactional inbox with [WithTxPerEvent], and its
// HandleConcurrent.
type eachRunner[M any] struct{ b *batch[M] }

func newEachRunner[M any](b *batch[M]) batchRunner[M] { return eachRunner[M]{b} }

func (r eachRunner[M]) open(_ context.Context, from int) (int, error) {
	return r.b.segmentEnd(from, len(r.b.ds)), nil
}

func (r eachRunner[M]) settle(ctx context.Context, i int) (pendingResult, next) {
	p := pendingResult{i: i, on: -1}
	p.res, p.err = r.b.w.process(ctx, &r.b.ds[i])
	return p, carryOn
}

func (r eachRunner[M]) settled(ctx context.Context, p pendingResult) bool { return r.b.settled(ctx, p) }

func (r eachRunner[M]) close(context.Context) next { return carryOn }

func (r eachRunner[M]) abandon(_ context.Context, i int) (int, bool) { return i, true }
