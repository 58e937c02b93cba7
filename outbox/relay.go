package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup/internal/logattr"
	"github.com/dedupkit/dedup/internal/nilcheck"
	"github.com/dedupkit/dedup/internal/outage"
)

// Relay publishes the committed events of an [Outbox]. Run as many relays as
// you like, in one process or many: each pass locks the rows it takes with
// FOR UPDATE SKIP LOCKED, so no row is taken by two relays at once, and a
// relay killed at any moment leaves its rows pending for the next pass.
type Relay struct {
	ob   *Outbox
	pg   *pgxpool.Config
	pub  Publisher
	cfg  relayConfig
	log  *slog.Logger
	purg time.Duration
	tel  *relayTelemetry  // nil: no spans, no metrics
	now  func() time.Time // the clock of health; tests drive it

	mu      sync.Mutex // guards the fields below
	running bool
	failing time.Time // start of the current run of failed passes, or of Run until its first pass succeeds; zero: none
	lastErr error     // the latest failed pass's, or what ended Run
}

// Health returns nil, or an error matching [dedup.ErrOutage] when the
// relay is not publishing: its passes have failed for the outage threshold
// ([WithOutageThreshold]) or longer, its first pass has not succeeded that
// long after Run began (a database unreachable from the start), or Run is
// not running (not started yet, or ended: the error says why). A readiness
// probe can serve it ([dedup.ReadinessHandler]).
func (r *Relay) Health() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.running && r.lastErr != nil:
		return &outage.Error{Msg: "outbox relay stopped: " + r.lastErr.Error(), Err: r.lastErr}
	case !r.running:
		return &outage.Error{Msg: "outbox relay not running"}
	case r.failing.IsZero() || r.now().Sub(r.failing) < r.cfg.outage:
		return nil
	case r.lastErr == nil:
		return &outage.Error{Msg: fmt.Sprintf("outbox relay: no pass succeeded in %v since it started",
			r.now().Sub(r.failing).Round(time.Millisecond))}
	}
	return &outage.Error{Msg: fmt.Sprintf("outbox relay passes failing for %v (since %s): %v",
		r.now().Sub(r.failing).Round(time.Millisecond), r.failing.UTC().Format(time.RFC3339), r.lastErr), Err: r.lastErr}
}

// passed records how a pass ended for Health: err nil, it succeeded.
func (r *Relay) passed(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		r.failing, r.lastErr = time.Time{}, nil
	case r.failing.IsZero():
		r.failing, r.lastErr = r.now(), err
	default:
		r.lastErr = err
	}
}

// runs records that Run began (ended false) or ended with err.
func (r *Relay) runs(ended bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running, r.lastErr = !ended, err
	if !ended {
		r.failing = r.now()
	}
}

// DefaultApplicationName is the application_name of a relay's connections
// unless its configuration sets one: what pg_stat_activity shows for them.
const DefaultApplicationName = "dedup-outbox-relay"

// NewRelay returns a relay of ob that publishes with pub. The relay opens its
// own connections with pg, at most two while it runs: one listening for
// notifications, and one holding each pass's transaction open while the broker
// acknowledges, which is why it never borrows the application's pool (a
// third reads the backlog's metrics when [WithMeterProvider] is given).
func NewRelay(ob *Outbox, pg *pgxpool.Config, pub Publisher, opts ...RelayOpt) (*Relay, error) {
	switch {
	case ob == nil:
		return nil, fmt.Errorf("%w: nil outbox", errConfig)
	case pg == nil:
		return nil, fmt.Errorf("%w: nil pgxpool.Config", errConfig)
	case nilcheck.IsNil(pub):
		return nil, fmt.Errorf("%w: nil publisher", errConfig)
	}
	cfg := defaultRelayConfig()
	for _, o := range opts {
		o.apply(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.busyPoll = min(cfg.busyPoll, cfg.poll)
	log := cfg.logger
	if log == nil {
		log = slog.Default()
	}
	tel, err := newRelayTelemetry(&cfg, ob.table)
	if err != nil {
		return nil, fmt.Errorf("%w: OpenTelemetry instruments: %w", errConfig, err)
	}
	pg = pg.Copy()
	pg.MaxConns, pg.MinConns = 1, 0
	if tel != nil && tel.meter != nil {
		pg.MaxConns = 2 // the backlog's reads never wait for a pass
	}
	if pg.ConnConfig.RuntimeParams["application_name"] == "" {
		pg.ConnConfig.RuntimeParams["application_name"] = DefaultApplicationName
	}
	return &Relay{ob: ob, pg: pg, pub: pub, cfg: cfg, tel: tel, log: log.With(slog.String("outbox", ob.table)),
		purg: min(max(cfg.retention/2, 10*time.Millisecond), time.Minute), now: time.Now}, nil
}

// Run publishes events until ctx is cancelled, then returns nil. It polls
// adaptively (see [WithPollInterval]) and passes at once when a
// notification arrives (see [WithNotify]). It returns ErrNotMigrated when
// the outbox table does not exist, and the server's *pgconn.PgError when it
// refuses the relay's connection for good (a database or role that does not
// exist, failed authentication): waiting cannot fix either. Other database
// errors are logged and retried, waiting longer each time up to five
// seconds.
func (r *Relay) Run(ctx context.Context) (err error) {
	r.runs(false, nil)
	defer func() { r.runs(true, err) }()
	pool, err := pgxpool.NewWithConfig(ctx, r.pg)
	if err != nil {
		return fmt.Errorf("outbox: relay pool: %w", err)
	}
	defer pool.Close()
	defer r.tel.observeBacklog(pool, r.ob.sql.backlog)()

	wake := make(chan struct{}, 1)
	lctx, stopListening := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.listen(lctx, wake) })
	defer func() {
		stopListening()
		wg.Wait()
	}()

	poll := time.NewTimer(0)
	defer poll.Stop()
	var failures int
	wait := r.cfg.busyPoll // until the next pass, unless woken
	nextPurge := time.Now()
	for {
		n, err := r.pass(ctx, pool)
		if ctx.Err() != nil {
			return nil
		}
		r.passed(err)
		if errors.Is(err, ErrNotMigrated) || refused(err) {
			return err
		}
		if err != nil {
			failures++
			wait := min(50*time.Millisecond<<min(failures, 7), 5*time.Second)
			r.log.Warn("outbox relay pass failed", slog.Any("error", err), slog.Int("failures", failures), logattr.Duration("retry_in", wait))
			if !sleep(ctx, wait) {
				return nil
			}
			continue
		}
		failures = 0
		if !r.cfg.deleteSent && time.Now().After(nextPurge) {
			if _, err := r.ob.Purge(ctx, pool, r.cfg.retention); err != nil && ctx.Err() == nil {
				r.log.Warn("outbox purge failed", slog.Any("error", err))
			}
			nextPurge = time.Now().Add(r.purg)
		}
		switch {
		case n >= r.cfg.batch:
			continue // a full batch settled: more is probably due
		case n > 0:
			wait = r.cfg.busyPoll
		default:
			wait = min(2*wait, r.cfg.poll)
		}
		poll.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-poll.C:
		}
	}
}

// refused reports whether err is the server refusing a connection in a way
// no retry fixes: SQLSTATE class 28 (invalid authorization: unknown role,
// failed authentication) or 3D000 (unknown database).
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000")
}

// listen keeps a connection listening on the outbox's channel and signals
// wake on every notification, and after each (re)connection, since
// notifications sent while disconnected are lost.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	var failures int
	for {
		err := r.listenOnce(ctx, signal)
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := min(100*time.Millisecond<<min(failures, 6), 5*time.Second)
		r.log.Warn("outbox relay: listening for notifications failed; polling meanwhile", slog.Any("error", err), logattr.Duration("retry_in", wait))
		if !sleep(ctx, wait) {
			return
		}
	}
}

func (r *Relay) listenOnce(ctx context.Context, signal func()) error {
	conn, err := pgx.ConnectConfig(ctx, r.pg.ConnConfig)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{r.ob.channel}.Sanitize()); err != nil {
		return err
	}
	signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal()
	}
}

// sleep waits d, or returns false when ctx ends first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
