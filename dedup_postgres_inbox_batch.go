package dedup

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup/internal/txguard"
)

// maxTxEvents is how many events one transaction of a batched inbox holds
// at most: it keeps their rows locked until it commits.
const maxTxEvents = 1024

// inboxChunk runs a HandleBatch of the transactional inbox: the events of a
// segment share one transaction, which claims their keys in one statement,
// writing each record straight in its final state, and commits once. No
// savepoint is taken: the uncommitted rows are the events' leases.
//
// A failed handler's verdict stands: it does not run again within the
// batch. When it made no statement, its failure is recorded in the segment's
// transaction; when it wrote, the segment is rolled back and run again
// up to it (the handlers that succeeded before it run again, their first
// run's writes gone) with its verdict in place of its handler. An event to be
// dead-lettered has its record turned into a leased claim in progress,
// committed with the segment; its dead letter and final write then follow
// on the store claim path, fenced on that claim (the batch's loop settles
// it, see [deferringRunner]), so that no letter is sent for an event whose
// transaction may still roll back. No result is given
// to yield before its transaction committed.
type inboxChunk[M any] struct {
	in       *inbox[M]
	b        *batch[M]
	from, to int
	tx       pgx.Tx  // nil: the segment claims nothing
	claims   []Claim // by delivery from from, for those the segment claims
	// verdicts are the errors of the handlers that failed, by delivery.
	verdicts map[int]error
	// cut ends the segment opened again after a rollback right after the
	// handler that caused it, so that no handler runs more than twice.
	cut int
}

func (in *inbox[M]) newChunk(b *batch[M]) batchRunner[M] { return &inboxChunk[M]{in: in, b: b} }

// chunkNeed is what a chunk attempt needs of its segment for a step it
// cannot take in the shared transaction.
type chunkNeed int

const (
	needNothing  chunkNeed = iota
	needRollback           // its handler wrote, then failed: the segment runs again, up to it
	needCommit             // its outcome is settled once the segment committed
)

func (r *inboxChunk[M]) open(ctx context.Context, from int) (int, error) {
	b := r.b
	r.from, r.tx = from, nil
	if b.apart != nil && b.apart[from] {
		r.to = from + 1
		return r.to, nil
	}
	r.to = b.segmentEnd(from, maxTxEvents)
	if r.cut > from {
		r.to = min(r.to, r.cut)
	}
	reqs := b.reqs[:0]
	for i := from; i < r.to; i++ {
		if b.claims(i) {
			reqs = append(reqs, b.ds[i].request(b.w.cfg.ttl))
		}
	}
	b.reqs = reqs
	if len(reqs) == 0 {
		return r.to, nil
	}
	tx, err := r.in.store.txConns.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("dedup: inbox begin: %w", err)
	}
	claims, err := r.in.store.claimBatchInTx(ctx, tx, reqs)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return 0, err
	}
	r.tx, r.claims = tx, r.claims[:0]
	for i, k := from, 0; i < r.to; i++ {
		var c Claim
		if b.claims(i) {
			c = claims[k]
			k++
		}
		r.claims = append(r.claims, c)
	}
	return r.to, nil
}

func (r *inboxChunk[M]) settle(ctx context.Context, i int) (pendingResult, next) {
	w, d := r.b.w, &r.b.ds[i]
	p := pendingResult{i: i, on: -1}
	if r.tx == nil {
		p.res, p.err = r.settleApart(ctx, i)
		return p, carryOn
	}
	c := r.claims[i-r.from]
	att := &chunkAttempt[M]{r: r, i: i, tx: txguard.Tx{Tx: r.tx, Owned: ErrTxOwned}}
	p.res, p.err = w.settle(ctx, d, c, att)
	switch {
	case att.need == needRollback:
		r.rollback(ctx)
		r.cut = i + 1
		return p, redo
	case att.need == needCommit:
		if err := r.in.store.leaseInTx(ctx, r.tx, d.key, d.owner, d.leaseTime); err != nil {
			r.runApart(ctx, err)
			return p, redo
		}
		return p, afterClose
	case p.err != nil && txBroken(r.tx):
		r.runApart(ctx, fmt.Errorf("dedup: inbox batch transaction broken at %s: %w", d.key, p.err))
		return p, redo
	}
	return p, carryOn
}

// deferred returns the claim of delivery i as its segment committed it, a
// leased claim in progress, and its handler's verdict.
func (r *inboxChunk[M]) deferred(i int) (Claim, error) {
	c := r.claims[i-r.from]
	c.Record.Status = StatusProcessing
	return c, r.verdicts[i]
}

// verdictAttempt settles on the store claim path an attempt whose handler
// already ran: its verdict is the handler's error, or nil when the claim's
// attempts were exhausted before it ran.
type verdictAttempt[M any] struct {
	storeAttempt[M]
	verdict error
}

func (a verdictAttempt[M]) run(context.Context, *delivery[M]) error { return a.verdict }

// settleApart settles delivery i in a transaction of its own. When its
// handler already failed in a segment that was rolled back, that failure is
// its attempt's: the handler does not run again.
func (r *inboxChunk[M]) settleApart(ctx context.Context, i int) (Result, error) {
	w, d := r.b.w, &r.b.ds[i]
	verdict, ok := r.verdicts[i]
	if !ok {
		return w.process(ctx, d)
	}
	c, att, err := r.in.claimWith(ctx, d, verdict)
	if err != nil {
		return Result{Key: d.key}, err
	}
	return w.settle(ctx, d, c, att)
}

func (r *inboxChunk[M]) settled(context.Context, pendingResult) bool { return true }

// close commits the segment's transaction; the batch's loop then settles
// the events left for after it, and gives the results.
func (r *inboxChunk[M]) close(ctx context.Context) next {
	if r.tx != nil {
		tx := r.tx
		r.tx = nil
		if err := tx.Commit(ctx); err != nil {
			r.runApart(ctx, fmt.Errorf("dedup: inbox commit of %d events: %w", r.to-r.from, err))
			return redo
		}
	}
	return carryOn
}

// abandon stops the segment only when ctx is done, which its handlers'
// writes will not outlive: the transaction is rolled back and its events
// come back, from the segment's beginning. A transport's stop signal lets
// the segment finish.
func (r *inboxChunk[M]) abandon(ctx context.Context, i int) (int, bool) {
	if ctx.Err() == nil {
		return 0, false
	}
	if r.tx == nil {
		return i, true
	}
	r.rollback(ctx)
	return r.from, true
}

// runApart rolls back the segment, whose transaction failed with err, and
// marks its claimed events to run each in a transaction of its own: the
// event that broke it (a deferred constraint its handler violated, a
// statement that ended the connection) then fails alone, and the others are
// settled.
func (r *inboxChunk[M]) runApart(ctx context.Context, err error) {
	r.rollback(ctx)
	r.b.w.cfg.logger.Warn("dedup: an inbox batch's transaction failed; running its events one transaction each",
		slog.Int("events", r.to-r.from), slog.Any("error", err))
	for i := r.from; i < r.to; i++ {
		if r.b.claims(i) {
			r.b.setApart(i)
		}
	}
}

func (r *inboxChunk[M]) rollback(ctx context.Context) {
	if r.tx != nil {
		_ = r.tx.Rollback(context.WithoutCancel(ctx))
		r.tx = nil
	}
}

// txBroken reports whether tx can no longer commit.
func txBroken(tx pgx.Tx) bool { return txStatus(tx) != 'T' }

// chunkAttempt is an event's attempt in its segment's shared transaction.
// The record was written as succeeded by the segment's claim, and commits
// with it; a failure that needs more than one write in the transaction
// makes the event run apart.
type chunkAttempt[M any] struct {
	r    *inboxChunk[M]
	i    int // the delivery's index
	tx   txguard.Tx
	need chunkNeed // what a step it could not take needs of the segment
}

func (a *chunkAttempt[M]) run(ctx context.Context, d *delivery[M]) (err error) {
	if verdict, ok := a.r.verdicts[a.i]; ok {
		return verdict
	}
	defer func() {
		if err != nil {
			if a.r.verdicts == nil {
				a.r.verdicts = make(map[int]error)
			}
			a.r.verdicts[a.i] = err
		}
	}()
	defer capturePanic(&err)
	if err := a.r.in.handler(ctx, &a.tx, d.msg); err != nil {
		return err
	}
	return abortedRun(a.r.tx)
}

// hold is asked before a dead letter, which is sent once the segment
// committed the event's record as a leased claim.
func (a *chunkAttempt[M]) hold(context.Context, *delivery[M]) error {
	if a.tx.Used() {
		a.need = needRollback
	} else {
		a.need = needCommit
	}
	return nil
}

// left reports whether a step was left to the segment, which acts on need
// once settle returns.
func (a *chunkAttempt[M]) left() bool { return a.need != needNothing }

func (a *chunkAttempt[M]) complete(context.Context, *delivery[M], bool) error { return nil }

// fail records the failure in the shared transaction when the handler wrote
// nothing there; otherwise its writes can only go with the transaction.
func (a *chunkAttempt[M]) fail(ctx context.Context, d *delivery[M], f Failure, _ bool) (int, error) {
	if a.tx.Used() {
		a.need = needRollback
		return 0, nil
	}
	attempts, err := a.r.in.store.failInBatchTx(ctx, a.r.tx, d.key, d.owner, f, false)
	if err != nil {
		return 0, unrepeatable{err} // the transaction is broken: the segment runs apart
	}
	return attempts, nil
}

func (a *chunkAttempt[M]) end(context.Context, *delivery[M]) {}
