package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/txguard"
)

// exchange is a request whose key was acquired, as the core's attempt runs
// it: its handler (next in store mode, txh in transactional mode), the
// recorded answer, and how the handler's run ended.
type exchange struct {
	r    *http.Request
	rec  *recorder
	next http.Handler
	txh  TxHandlerFunc

	ended   error // why the request ended before the handler returned, if it did (see endedCause)
	txEnded bool  // the handler tried to commit or roll back its transaction
}

// serveNext is the store mode's handler: it runs next with ctx, the
// attempt's, cancelled when the request ends or the claim is lost.
func serveNext(ctx context.Context, x *exchange) error {
	x.next.ServeHTTP(x.rec, x.r.WithContext(ctx))
	x.ended = endedCause(ctx)
	return nil
}

// serveTx is the transactional mode's handler: it runs the TxHandlerFunc
// with tx, the attempt's, which the handler may use but not end.
func serveTx(ctx context.Context, tx pgx.Tx, x *exchange) error {
	htx := &txguard.Tx{Tx: tx, Owned: ErrTxOwned}
	x.txh(x.rec, x.r, htx)
	x.ended, x.txEnded = endedCause(ctx), htx.Ended()
	return nil
}

// attempt runs x's handler on att, an acquired claim of x's key, records
// the outcome and answers it. The handler sees the request's context; the
// claim is held, and the outcome recorded, whether the client still waits
// or not (see dedup.Front), so a retry never runs the operation beside it.
//
// A recorder that streams (store mode) has answered an answer over the
// snapshot limit already, and an answer that is not stored stays answered
// as the handler's effects stay applied; a transactional one has not, and
// an answer that is not stored is replaced by a problem, as its effects
// roll back with the failure.
func (f *front) attempt(w http.ResponseWriter, p *prepared, att *dedup.Attempt[*exchange], x *exchange) {
	ctx := x.r.Context()
	defer att.End(ctx)
	err := att.Run(ctx, x)
	rec, tx := x.rec, !x.rec.stream
	fail := func(reason string) {
		if err := att.Fail(ctx, errors.New(reason)); err != nil {
			f.cfg.logger.Warn("idemhttp: could not leave the key retryable; it is freed when its lease lapses",
				slog.Any("key", p.key), slog.String("reason", reason), slog.Any("error", err))
		}
	}
	switch {
	case err != nil:
		// Run returns an error only for a panic: the handlers return nil.
		perr := panicOf(err)
		fail(fmt.Sprintf("handler panic: %v", perr.Value))
		panic(perr.Value)
	case rec.over:
		fail("response over the snapshot limit")
		if !tx {
			f.cfg.logger.Warn("idemhttp: response answered but not stored (over the snapshot limit); a retry runs the handler again",
				slog.Any("key", p.key), slog.Int("limit", f.cfg.maxSnapshot))
			return
		}
		f.answerOverLimit(w, p)
		return
	case x.txEnded:
		fail("the handler ended its transaction")
		f.answerTxEnded(w, p)
		return
	case !f.storable(x.ended, rec):
		fail("status " + strconv.Itoa(rec.status))
		f.answer(x.ended, w, rec)
		return
	}
	snap, err := encodeSnapshot(rec.status, rec.header, f.cfg.storedHeaders, rec.body.Bytes())
	if err != nil {
		fail("response not storable")
		if !tx {
			f.cfg.logger.Warn("idemhttp: response answered but not stored (its headers could not be replayed); a retry runs the handler again",
				slog.Any("key", p.key), slog.Any("error", err))
			rec.flush()
			return
		}
		f.cfg.logger.Warn("idemhttp: response's headers could not be replayed; transaction rolled back",
			slog.Any("key", p.key), slog.Any("error", err))
		f.cfg.writeProblem(w, ProblemUnstorable, http.StatusInternalServerError,
			"the answer's headers cannot be stored for replay, so the operation was not applied", 0)
		return
	}
	if rec.status >= 400 { // a final 4xx: a refusal, which stands without the handler's writes
		err = att.Refuse(ctx, snap)
	} else {
		err = att.Complete(ctx, snap)
	}
	switch {
	case err == nil:
		f.cacheSettled(p, snap) // before the answer, so that its client's retry finds it
		rec.flush()
	case errors.Is(err, dedup.ErrTxAborted): // recorded as the attempt's failure
		f.answerTxAborted(w, p, rec.status)
	case tx:
		// Either nothing committed (a retry runs afresh) or the commit's
		// answer was lost (a retry replays): retrying is right both ways.
		f.storeError(w, p, "complete", err)
	case errors.Is(err, dedup.ErrLeaseLost):
		f.cfg.logger.Error("idemhttp: handler outlived its lease; its response was not stored and another request may have run it again",
			slog.Any("key", p.key), slog.Any("error", err))
		f.cfg.writeProblem(w, ProblemLeaseLost, http.StatusServiceUnavailable,
			"the request took longer than its lease; retry to get the stored answer", f.cfg.retryAfter)
	default:
		// The effect is done but not recorded: answering it is the best
		// the client can get; a retry after the lease would run it again.
		f.cfg.logger.Error("idemhttp: response answered but not stored; a retry after the lease runs the handler again",
			slog.Any("key", p.key), slog.Any("error", err))
		rec.flush()
	}
}

// The answers of a transactional request (keyed or not, p nil) whose work
// could not commit, each logged and answered 500 with its problem.

// answerOverLimit answers a request whose answer is over the snapshot
// limit: it cannot be sent after the commit, so the work was rolled back.
func (f *front) answerOverLimit(w http.ResponseWriter, p *prepared) {
	f.cfg.logger.Warn("idemhttp: response over the snapshot limit; transaction rolled back",
		keyAttr(p), slog.Int("limit", f.cfg.maxSnapshot))
	f.cfg.writeProblem(w, ProblemTooLarge, http.StatusInternalServerError,
		fmt.Sprintf("the answer is over the %d bytes a stored response may hold (WithMaxSnapshotBytes), so the operation was not applied; "+
			"every retry of it will get this answer until the limit is raised", f.cfg.maxSnapshot), 0)
}

// answerTxEnded answers a request whose handler committed or rolled back
// the transaction the middleware ends.
func (f *front) answerTxEnded(w http.ResponseWriter, p *prepared) {
	f.cfg.logger.Error("idemhttp: the handler committed or rolled back its transaction, which the middleware ends; rolled back",
		keyAttr(p))
	f.cfg.writeProblem(w, ProblemTxEnded, http.StatusInternalServerError,
		"the handler tried to end the transaction the middleware commits, so the operation was not applied", 0)
}

// answerTxAborted answers a request whose handler answered status, a
// success, after a failed statement aborted its transaction: the writes
// the answer reports cannot commit.
func (f *front) answerTxAborted(w http.ResponseWriter, p *prepared, status int) {
	f.cfg.logger.Error("idemhttp: handler answered after a failed statement aborted its transaction; rolled back",
		keyAttr(p), slog.Int("status", status))
	detail := "a statement of the handler failed, so the operation was not applied"
	if p != nil {
		detail += "; retry with the same key"
	}
	f.cfg.writeProblem(w, ProblemTxAborted, http.StatusInternalServerError, detail, 0)
}

// panicOf returns the *dedup.PanicError that err, an error of Attempt.Run,
// is. Kept out of attempt so that the target of errors.As escapes only
// after a panic.
func panicOf(err error) *dedup.PanicError {
	var perr *dedup.PanicError
	if !errors.As(err, &perr) {
		return &dedup.PanicError{Value: err}
	}
	return perr
}

// answer sends an answer that is not stored: the handler's own, or, when
// its request ended (ended, see endedCause) before it wrote anything, a
// problem saying why.
func (f *front) answer(ended error, w http.ResponseWriter, rec *recorder) {
	switch {
	case rec.wrote || ended == nil:
		rec.flush()
	case errors.Is(ended, dedup.ErrLeaseLost):
		f.cfg.writeProblem(w, ProblemLeaseLost, http.StatusServiceUnavailable,
			"the request's claim on its key was lost; retry with the same key", f.cfg.retryAfter)
	default:
		f.cfg.writeProblem(w, ProblemAbandoned, http.StatusServiceUnavailable,
			"the request ended before the handler answered; retry with the same key", f.cfg.retryAfter)
	}
}

// storable reports whether a recorded answer is final: a 2xx or a final
// 4xx, written by the handler or returned normally. A handler whose request
// ended (client gone, timeout, lease lost) without writing anything
// answered nothing.
func (f *front) storable(ended error, rec *recorder) bool {
	if !rec.wrote && ended != nil {
		return false
	}
	return (rec.status >= 200 && rec.status < 300) || f.cfg.final[rec.status]
}

// endedCause returns why ctx ended, or nil while it has not.
func endedCause(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}
