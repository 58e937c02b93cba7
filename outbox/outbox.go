package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/nilcheck"
	"github.com/dedupkit/dedup/internal/pgident"
)

// DefaultTable is the table an [Outbox] uses unless [WithTable] names another.
const DefaultTable = "outbox_events"

var errConfig = dedup.ErrConfig

// DB is what the administrative functions run their statements on: a
// *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Outbox is one outbox table: how events are written to it ([Outbox.Add]),
// created ([Outbox.Migrate]) and administered ([Outbox.Requeue],
// [Outbox.Failed], [Outbox.Purge]). A [Relay] publishes its rows. It holds no
// connection and is safe for concurrent use.
type Outbox struct {
	table   string // quoted, possibly schema-qualified
	channel string // the LISTEN/NOTIFY channel
	notify  bool
	relays  int32 // the advisory lock namespace of the relays' key locks
	sql     statements
}

// Opt configures an [Outbox].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	table  string
	notify bool
}

// WithTable sets the table name, optionally schema-qualified ("schema.table").
// Each part must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$, as for the dedup
// PostgreSQL store; New reports another name as a *dedup.TableNameError.
func WithTable(name string) Opt { return optFunc(func(c *config) { c.table = name }) }

// WithNotify sets whether [Outbox.Add] notifies the relays when its
// transaction commits (default false). A notified relay passes at once,
// which saves a quiet outbox up to a poll interval (see
// outbox.WithPollInterval) per event. It is off by default because it costs
// the writers: PostgreSQL commits notifying transactions one at a time, each
// waiting for its own WAL flush, which capped 8 concurrent writers at 40-50%
// of the commit rate they reach without it (BENCHMARKS.md), while relays
// polling adaptively publish within milliseconds of a commit whenever events
// keep arriving. Turn it on where few transactions commit events and each
// must go out at once.
func WithNotify(enabled bool) Opt { return optFunc(func(c *config) { c.notify = enabled }) }

// New returns the outbox kept in the table of [DefaultTable] or [WithTable].
func New(opts ...Opt) (*Outbox, error) {
	cfg := config{table: DefaultTable}
	for _, o := range opts {
		o.apply(&cfg)
	}
	ident, err := parseTableName(cfg.table)
	if err != nil {
		return nil, err
	}
	h := fnv.New64a()
	h.Write([]byte(cfg.table))
	table := ident.Sanitize()
	return &Outbox{
		table:   table,
		channel: fmt.Sprintf("outbox_%016x", h.Sum64()),
		notify:  cfg.notify,
		relays:  int32(h.Sum64()),
		sql:     buildStatements(table, ident[len(ident)-1]),
	}, nil
}

// parseTableName splits name into at most a schema and a table, each a plain
// SQL identifier, as for the dedup PostgreSQL store.
func parseTableName(name string) (pgx.Identifier, error) {
	ident, reason := pgident.Parse(name)
	if reason != "" {
		return nil, &dedup.TableNameError{Name: name, Reason: reason}
	}
	return ident, nil
}

// Migrate creates the outbox table and its indexes if they do not exist. It
// is safe to run from several processes at once. db is usually a pool; the
// migration runs in a transaction of its own (a savepoint when db is a
// transaction).
func (o *Outbox) Migrate(ctx context.Context, db DB) error {
	if nilcheck.IsNil(db) {
		return fmt.Errorf("%w: nil DB", errConfig)
	}
	// The advisory lock makes concurrent migrations wait for each other
	// instead of racing on CREATE ... IF NOT EXISTS, which is not atomic. It
	// is a transaction's lock: on a pool, outside a transaction, it would be
	// released as soon as taken.
	migrate := func(db DB) error {
		for _, stmt := range []string{o.sql.migrateLock, o.sql.createTable, o.sql.createPending, o.sql.createKeyHead, o.sql.createSent, o.sql.createBackoff} {
			if _, err := db.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	}
	var err error
	if b, ok := db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	}); ok {
		err = pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error { return migrate(tx) })
	} else {
		err = migrate(db)
	}
	if err != nil {
		return fmt.Errorf("outbox: migrate %s: %w", o.table, err)
	}
	return nil
}

// notMigrated turns PostgreSQL's "undefined table" into ErrNotMigrated.
func (o *Outbox) notMigrated(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		return fmt.Errorf("%w: %s", ErrNotMigrated, o.table)
	}
	return err
}
