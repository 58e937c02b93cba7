package dedup

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WithTxConns bounds how many of the pool's connections the transactional
// inbox of a [PostgresStore] holds at once, across every [WrapTx] wrapper
// on the store: an event beyond the bound waits for one of their
// transactions to end, for as long as its context lets it, before it
// begins its own. The default leaves a quarter of the pool's MaxConns, at
// least one connection, to everything else on the pool (an API, a
// handler's own queries): n = MaxConns - max(1, MaxConns/4), at least 1.
// An n below 1 or above MaxConns is refused with [ErrConfig]; an n equal to
// MaxConns leaves nothing beside the inbox and is logged at WARN by WrapTx.
// The bound is the store's: stores sharing a pool have one each, so give
// them bounds that add up below MaxConns, or share one store. A
// [DynamoDBStore] refuses it.
func WithTxConns(n int) StoreOpt {
	return storeOptFunc(func(c *storeConfig) { c.txConns, c.txConnsGiven = n, true })
}

// TxConns returns how many of the pool's connections the store's
// transactional inbox holds at most at once (see [WithTxConns]).
func (s *PostgresStore) TxConns() int { return cap(s.txConns.slots) }

// txReserve is how many of a pool of maxConns connections the default bound
// leaves to everything beside the transactional inbox: a quarter, at least
// one. The rest of the pool serves short queries, an inbox transaction
// lasts a handler's run; a share, not a count, grows with a pool enlarged
// for the API.
func txReserve(maxConns int) int { return max(1, maxConns/4) }

// defaultTxConns is the bound WithTxConns defaults to on a pool of
// maxConns connections.
func defaultTxConns(maxConns int) int { return max(1, maxConns-txReserve(maxConns)) }

// poolFor returns the smallest MaxConns whose default bound is at least n,
// for a message saying what to change.
func poolFor(n int) int {
	m := n + 1
	for defaultTxConns(m) < n {
		m++
	}
	return m
}

// txBudget begins the transactional inbox's transactions on a store's
// pool, each holding one of its slots until it ends. It belongs to the
// store, not to a wrapper: every WrapTx on the store draws on it, so that
// their sum stays under the pool's size. A front end's transactions
// (NewTxFront, idemhttp.NewTx) are not counted: they are what the rest of
// the pool is kept for, and counting them would queue each request behind
// the consumers' backlog.
type txBudget struct {
	pool     *pgxpool.Pool
	slots    chan struct{} // a token per transaction open
	maxConns int           // the pool's MaxConns
}

// newTxBudget returns the budget cfg gives pool's inbox transactions, or
// an error matching ErrConfig for a bound the pool cannot give.
func newTxBudget(pool *pgxpool.Pool, cfg storeConfig) (*txBudget, error) {
	maxConns := int(pool.Config().MaxConns)
	n := defaultTxConns(maxConns)
	if cfg.txConnsGiven {
		n = cfg.txConns
		switch {
		case n < 1:
			return nil, fmt.Errorf("%w: WithTxConns(%d): the inbox needs at least one connection", ErrConfig, n)
		case n > maxConns:
			return nil, fmt.Errorf("%w: WithTxConns(%d): the pool has %d connections (MaxConns); raise MaxConns to %d to leave a quarter of it beside the inbox, or bound the inbox to %d",
				ErrConfig, n, maxConns, poolFor(n), defaultTxConns(maxConns))
		}
	}
	return &txBudget{pool: pool, slots: make(chan struct{}, n), maxConns: maxConns}, nil
}

// warnNoReserve logs at WARN when the inbox may hold every connection of
// the pool, naming both numbers and what to change.
func (b *txBudget) warnNoReserve(logger *slog.Logger) {
	n := cap(b.slots)
	if n < b.maxConns {
		return
	}
	fix := fmt.Sprintf("raise the pool's MaxConns (pool_max_conns) to %d", poolFor(n))
	if b.maxConns > 1 {
		fix += fmt.Sprintf(", or bound the inbox with dedup.WithTxConns(%d)", defaultTxConns(b.maxConns))
	}
	logger.Warn("dedup: the transactional inbox may hold every connection of its pool; other queries on the pool wait while a backlog drains",
		slog.Int("tx_conns", n), slog.Int("pool_max_conns", b.maxConns), slog.String("fix", fix))
}

// Begin waits for a slot, or for ctx to be done, then begins a transaction
// on the pool that gives its slot back when it ends.
func (b *txBudget) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, b.waitErr(err)
	}
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, b.waitErr(ctx.Err())
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		<-b.slots
		return nil, err
	}
	return &budgetTx{Tx: tx, b: b}, nil
}

func (b *txBudget) waitErr(err error) error {
	return fmt.Errorf("waiting for one of the %d connections the inbox may hold (WithTxConns): %w", cap(b.slots), err)
}

// budgetTx is an inbox transaction holding a slot of its budget until its
// Commit or Rollback returned its connection to the pool.
type budgetTx struct {
	pgx.Tx
	b     *txBudget
	freed atomic.Bool
}

func (t *budgetTx) Commit(ctx context.Context) error {
	defer t.free()
	return t.Tx.Commit(ctx)
}

func (t *budgetTx) Rollback(ctx context.Context) error {
	defer t.free()
	return t.Tx.Rollback(ctx)
}

// free gives the slot back once, however often the transaction is ended.
func (t *budgetTx) free() {
	if t.freed.CompareAndSwap(false, true) {
		<-t.b.slots
	}
}
