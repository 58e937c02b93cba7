package dedup

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
)

// maxTxEvents is how many events one transaction of a batched inbox holds
// at most: it keeps their rows locked until it commits, and each handler
// runs after a savepoint of its own, while PostgreSQL caches the
// subtransactions of a transaction up to 64, past which every other
// session's snapshots get slower.
const maxTxEvents = 64

// runBatch runs a HandleBatch of the transactional inbox: the events of a
// batch share transactions of up to maxTxEvents, each claiming its keys in
// one statement and committing once. Each handler runs after a savepoint of
// its own; a failure rolls back to it and records the failure in the same
// transaction, so that one event's failure takes neither the others' effects
// nor its own attempt with it. No result is given to yield before its
// transaction committed.
func (s inboxSteps[M]) runBatch(ctx context.Context, b *batch[M]) {
	for from := 0; from < len(b.ds); {
		if ctx.Err() != nil || b.stopped() {
			return
		}
		to := s.chunkEnd(b, from)
		if !s.runChunk(ctx, b, from, to) {
			return
		}
		from = to
	}
}

// ownClaim reports whether delivery i is claimed: the batch's first copy of
// its key, or a later copy with another payload, which the store must judge
// against the first's committed record.
func (b *batch[M]) ownClaim(i int) bool {
	return b.ds[i].bad == "" && (b.first[i] < 0 || b.ds[i].fp != b.ds[b.first[i]].fp)
}

// chunkEnd returns the end of the transaction starting at from: at most
// maxTxEvents, and before a key the transaction claimed already.
func (s inboxSteps[M]) chunkEnd(b *batch[M], from int) int {
	to := min(len(b.ds), from+maxTxEvents)
	claimed := make(map[Key]struct{}, to-from)
	for i := from; i < to; i++ {
		if !b.ownClaim(i) {
			continue
		}
		if _, ok := claimed[b.ds[i].key]; ok {
			return i
		}
		claimed[b.ds[i].key] = struct{}{}
	}
	return to
}

// runChunk runs deliveries [from, to) in one transaction and gives their
// results to yield once it committed. It returns false when the batch must
// stop: the transaction failed, yield asked to stop, or the transport is
// stopping, which is noticed between transactions.
func (s inboxSteps[M]) runChunk(ctx context.Context, b *batch[M], from, to int) bool {
	w := b.w
	tx, err := s.store.pool.Begin(ctx)
	if err != nil {
		return b.failChunk(ctx, from, to, fmt.Errorf("dedup: inbox begin: %w", err))
	}
	var reqs []ClaimRequest
	for i := from; i < to; i++ {
		if b.ownClaim(i) {
			reqs = append(reqs, b.ds[i].request(s.ttl))
		}
	}
	claims, err := s.store.claimBatchInTx(ctx, tx, reqs)
	if err != nil {
		w.observeOutcome(ctx, err)
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return b.failChunk(ctx, from, to, err)
	}
	k := 0
	for i := from; i < to; i++ {
		d := &b.ds[i]
		p := pendingResult{i: i, comp: -1}
		switch {
		case d.bad != "":
			p.res, p.err = w.parkBad(ctx, d)
		case !b.ownClaim(i):
			p = b.copyOf(i)
		default:
			c := claims[k]
			k++
			p.res, p.err = s.settleInTx(ctx, w, d, tx, c)
		}
		b.outcomes[i] = p
		b.pending = append(b.pending, p)
		if p.err != nil && txBroken(tx) {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return s.runEach(ctx, b, from, to, p.err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return s.runEach(ctx, b, from, to, fmt.Errorf("dedup: inbox commit of %d events: %w", to-from, err))
	}
	return b.flush(ctx) && ctx.Err() == nil && !b.stopped()
}

// runEach runs deliveries [from, to) again, each in a transaction of its
// own, after their shared transaction failed with err: the event that broke
// it (a deferred constraint its handler violated, a statement that ended
// the connection) then fails alone, and the others are settled. Their
// handlers run twice; the first run's writes were rolled back.
func (s inboxSteps[M]) runEach(ctx context.Context, b *batch[M], from, to int, err error) bool {
	if ctx.Err() != nil {
		return b.failChunk(ctx, from, to, err)
	}
	w := b.w
	w.cfg.logger.Warn("dedup: an inbox batch's transaction failed; running its events one transaction each",
		slog.Int("events", to-from), slog.Any("error", err))
	b.pending = b.pending[:0]
	for i := from; i < to; i++ {
		d := &b.ds[i]
		p := b.outcomes[i] // a bad ID was dead-lettered already
		switch {
		case d.bad != "":
		case !b.ownClaim(i):
			p = b.copyOf(i)
		default:
			p = pendingResult{i: i, comp: -1}
			p.res, p.err = w.process(ctx, d)
		}
		b.outcomes[i] = p
		b.pending = append(b.pending, p)
	}
	return b.flush(ctx) && ctx.Err() == nil && !b.stopped()
}

// settleInTx settles one claimed delivery of a batch in its transaction.
func (s inboxSteps[M]) settleInTx(ctx context.Context, w *Wrapper[M], d *delivery[M], tx pgx.Tx, c Claim) (Result, error) {
	d.tx, d.sharedTx = tx, true
	return w.settle(ctx, d, c, nil)
}

// txBroken reports whether tx can no longer commit.
func txBroken(tx pgx.Tx) bool {
	conn := tx.Conn().PgConn()
	return conn.IsClosed() || conn.TxStatus() != 'T'
}

// failChunk answers deliveries [from, to) with err: their transaction did
// not commit, so none of them is settled, and the batch stops.
func (b *batch[M]) failChunk(ctx context.Context, from, to int, err error) bool {
	b.pending = b.pending[:0]
	for i := from; i < to; i++ {
		b.outcomes[i] = pendingResult{i: i, comp: -1, res: Result{Key: b.ds[i].key}, err: err}
	}
	b.w.observe(ctx, &b.ds[from], Result{Key: b.ds[from].key}, err)
	b.yield(from, Result{Key: b.ds[from].key}, err)
	return false
}
