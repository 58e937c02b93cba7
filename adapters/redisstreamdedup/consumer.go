package redisstreamdedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/consumeropt"
	"github.com/dedupkit/dedup/internal/heartbeat"
	"github.com/dedupkit/dedup/internal/slots"
)

// Consumer reads the entries of a stream as one consumer of a consumer
// group and runs them through a dedup.Wrapper, then acts on each outcome.
// The entries of one read are claimed in one store call, handled
// concurrently and their successes completed together
// ([dedup.Wrapper.HandleConcurrent]); the next batch is read and handled
// meanwhile. The outcomes:
//
//   - OutcomeProcessed, OutcomeDuplicate: the entry is acknowledged (XACK;
//     one that fails is tried again with the next).
//   - OutcomeDeadLettered, OutcomeConflict: the wrapper has parked the
//     entry in its dead-letter sink and recorded it; the entry is
//     acknowledged.
//   - OutcomeRetry: the entry is given back (see below) to come again
//     after Result.RetryAfter.
//   - OutcomeInFlight (the event is being handled elsewhere): given back
//     for the wrapper's RetryAfter or [WithInFlightDelay], the shorter.
//   - An error (the store or the sink unreachable): given back with a
//     backoff that grows while errors last. Nothing is acknowledged.
//
// An entry stays in the group's pending entry list until acknowledged.
// Redis has no negative acknowledgement: an entry is given back by setting
// its idle time (XCLAIM ... IDLE) so that it reaches [WithClaimIdle] when
// its delay is over, and any consumer of the group, this one included,
// then takes it over with XAUTOCLAIM, which counts a delivery. The pending
// entries are scanned every [WithBlock]. The entries of a consumer that
// died are taken over the same way once idle for the claim idle time.
// While an entry is held, a heartbeat resets its idle time every third of
// the claim idle time, so that a handler may take longer; the store lease
// of each call is the claim idle time (dedup.CallLease) unless the wrapper
// sets dedup.WithLease. XACK does not fence: a consumer that stalled past
// the claim idle time may still acknowledge an entry another took over;
// the store's lease fences their handlers, so the event has one effect.
//
// The delivery count of the pending entry list (XPENDING's) is the
// transport's attempt count: 1 for an entry read new, and one more at each
// takeover. Entries are handled in no particular order. The stream's
// length is left to the user: trim it (XADD MAXLEN or MINID, XTRIM) no
// further than the entries every group has acknowledged; an entry trimmed
// while pending is dropped from the pending entry list by XAUTOCLAIM, and
// logged.
//
// Several Consumers, in one process or many, may read one group, each
// with its own name: the wrapper gives each event one effect.
type Consumer struct {
	rdb    redis.UniversalClient
	stream string
	group  string
	w      *dedup.Wrapper[*Message]
	cfg    config
	log    *slog.Logger
	// lost is set while Redis does not answer Run's reads.
	lost atomic.Pointer[loss]
}

// NewConsumer returns a Consumer reading stream as a consumer of group and
// running entries through w, which should read them with [Messages]. The
// group must exist (XGROUP CREATE stream group $ MKSTREAM); rdb is the
// caller's, who closes it.
func NewConsumer(rdb redis.UniversalClient, stream, group string, w *dedup.Wrapper[*Message], opts ...Opt) (*Consumer, error) {
	cfg, err := consumeropt.Build(defaultConfig(), opts, Opt.apply, (*config).validate)
	if err != nil {
		return nil, err
	}
	switch {
	case rdb == nil:
		return nil, fmt.Errorf("%w: redisstreamdedup: nil Redis client", dedup.ErrConfig)
	case stream == "" || group == "":
		return nil, fmt.Errorf("%w: redisstreamdedup: stream %q and group %q must both be named", dedup.ErrConfig, stream, group)
	case w == nil:
		return nil, fmt.Errorf("%w: redisstreamdedup: nil wrapper", dedup.ErrConfig)
	}
	log := cfg.Logger.With(slog.String("stream", stream), slog.String("group", group), slog.String("consumer", cfg.name))
	return &Consumer{rdb: rdb, stream: stream, group: group, w: w, cfg: cfg, log: log}, nil
}

// Run reads and handles entries until ctx is done, then shuts down and
// returns nil: it stops reading (a read in progress is waited for, up to
// [WithBlock], and what it brings is given back), lets running handlers
// finish (cancelling their contexts after [WithShutdownTimeout]), and gives
// back the entries it will not handle, so that a consumer takes them over
// at its next scan. No goroutine of Run's outlives it.
//
// Run first checks that the group exists: it fails at once if Redis does
// not answer (unless ctx is done by then), or, with an error matching
// dedup.ErrConfig, if the group does not exist. With [WithMaxOutage], it
// returns an error matching [ErrOutage] once settling entries has kept
// failing for longer than that bound. While Redis does not answer, reads
// are retried with a backoff and [Consumer.Health] reports it.
func (c *Consumer) Run(ctx context.Context) error {
	r, err := c.prepare(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it started: nothing was read
		}
		return err
	}
	r.Run = adapterkit.Start(ctx, c.w, adapterkit.Config{
		Name: "redisstreamdedup", Log: c.log,
		ShutdownTimeout: c.cfg.ShutdownTimeout, MaxOutage: c.cfg.MaxOutage,
		InFlightDelay: c.cfg.InFlightDelay, Backoff: adapterkit.FailureBackoff,
	})
	defer c.lost.Store(nil) // Health speaks of a running consumer only
	r.Serve(r.hb.Run)
	r.poll(r.Ctx)
	return r.Stop(func() { r.ack(nil) })
}

// runner is the state of one Run.
type runner struct {
	*Consumer
	*adapterkit.Run
	batch int
	slots *slots.Slots
	hb    *heartbeat.Held[*Message]
	// cursor is where the scan of the pending entries goes on ("0-0": a new
	// scan), and lastScan when the last scan ended.
	cursor   string
	lastScan time.Time
	// unacked are settled entries whose acknowledgement failed.
	ackMu   sync.Mutex
	unacked []string
}

// prepare checks the group and returns a runner for it.
func (c *Consumer) prepare(ctx context.Context) (*runner, error) {
	groups, err := c.rdb.XInfoGroups(ctx, c.stream).Result()
	if err != nil && !isNoStream(err) {
		return nil, fmt.Errorf("redisstreamdedup: read the groups of stream %s: %w", c.stream, err)
	}
	found := false
	for _, g := range groups {
		found = found || g.Name == c.group
	}
	if !found {
		return nil, fmt.Errorf("%w: redisstreamdedup: stream %s has no consumer group %s: create it (XGROUP CREATE %s %s $ MKSTREAM)",
			dedup.ErrConfig, c.stream, c.group, c.stream, c.group)
	}
	if err := c.w.CheckCallLease(c.cfg.claimIdle, fmt.Sprintf("the claim idle time, %v", c.cfg.claimIdle)); err != nil {
		return nil, err
	}
	r := &runner{Consumer: c, batch: min(c.cfg.batchSize, c.cfg.workers), slots: slots.New(c.cfg.workers), cursor: scanStart}
	r.hb = heartbeat.New(c.cfg.claimIdle/3, func(m *Message) string { return m.ID }, r.touch)
	return r, nil
}

// isNoStream reports whether err is Redis's answer for a key that does not
// exist (XINFO on a missing stream).
func isNoStream(err error) bool { return err != nil && strings.Contains(err.Error(), "no such key") }

// poll reads batches and dispatches them until ctx is done.
func (r *runner) poll(ctx context.Context) {
	failures := 0
	for {
		n := r.slots.Take(ctx, r.batch)
		if n == 0 {
			return
		}
		msgs, err := r.read(ctx, n)
		r.slots.Give(n - len(msgs))
		if len(msgs) > 0 {
			r.hb.Add(msgs...)
			r.Dispatch(func() { r.handle(msgs) })
		}
		if err == nil {
			failures = 0
			r.answered()
			r.ack(nil) // those whose acknowledgement failed, if any
			continue
		}
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := dedup.ExponentialBackoff(100*time.Millisecond, 10*time.Second)(failures)
		r.failed(err, wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// read returns up to n entries: those pending long enough to take over,
// when a scan is due, else new ones, waiting up to the block time for the
// first. A read in progress is not cancelled when ctx ends (what Redis
// delivers to an abandoned read would stay pending for the claim idle
// time): it runs on BG.
func (r *runner) read(ctx context.Context, n int) ([]*Message, error) {
	if r.cursor != scanStart || time.Since(r.lastScan) >= r.cfg.block {
		msgs, err := r.claim(r.BG, n)
		if len(msgs) > 0 || err != nil || ctx.Err() != nil {
			return msgs, err
		}
	}
	streams, err := r.rdb.XReadGroup(r.BG, &redis.XReadGroupArgs{
		Group: r.group, Consumer: r.cfg.name, Streams: []string{r.stream, ">"}, Count: int64(n), Block: r.cfg.block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("XREADGROUP: %w", err)
	}
	var msgs []*Message
	for _, s := range streams {
		for _, x := range s.Messages {
			x.DeliveredCount = 1 // read new: its first delivery
			msgs = append(msgs, &Message{XMessage: x, Stream: r.stream, Group: r.group})
		}
	}
	return msgs, nil
}

// handle runs one read's entries through the wrapper and acts on their
// outcomes.
func (r *runner) handle(msgs []*Message) {
	defer r.slots.Give(len(msgs))
	acks := make([]string, 0, len(msgs))
	var back []givenBack
	adapterkit.Concurrent(r.Batch(), msgs, func(ms []*Message, yield func(int, dedup.Result, error)) error {
		return r.w.HandleConcurrent(r.Work, ms, yield, dedup.CallLease(r.cfg.claimIdle))
	}, func(i int, res dedup.Result, d adapterkit.Decision) {
		m := msgs[i]
		r.hb.Remove(m)
		if d.Settled() {
			acks = append(acks, m.ID)
			return
		}
		if d.Err != nil {
			d.LogFailure(r.Work, r.log, "redisstreamdedup: entry not acknowledged; it will come back",
				slog.String("entry", m.ID), slog.Any("key", res.Key))
		}
		back = append(back, givenBack{id: m.ID, delay: d.Delay})
	})
	r.ack(acks)
	r.giveBack(back)
}

// ack acknowledges settled entries in one XACK, together with those whose
// acknowledgement failed before; those it fails to acknowledge are kept
// for the next call (after the next read that succeeds, at the latest, and
// once more as Run stops), so that an outage leaves no settled entry
// pending once Redis answers again.
func (r *runner) ack(ids []string) {
	r.ackMu.Lock()
	ids, r.unacked = append(r.unacked, ids...), nil
	r.ackMu.Unlock()
	if len(ids) == 0 {
		return
	}
	if err := r.rdb.XAck(r.BG, r.stream, r.group, ids...).Err(); err != nil {
		r.log.Warn("redisstreamdedup: acknowledgement failed; the entries are settled, and acknowledged again later or, taken over, as duplicates",
			slog.Int("entries", len(ids)), slog.Any("error", err))
		r.ackMu.Lock()
		r.unacked = append(r.unacked, ids...)
		r.ackMu.Unlock()
	}
}
