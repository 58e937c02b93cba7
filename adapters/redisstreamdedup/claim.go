package redisstreamdedup

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"
)

// scanStart is the cursor of a scan of the pending entries from the first.
const scanStart = "0-0"

// maxScanCalls bounds the XAUTOCLAIM calls of one read: a long pending
// entry list with little to take over is scanned over several reads.
const maxScanCalls = 10

// claim takes over up to n entries pending for the claim idle time or
// longer (XAUTOCLAIM, which counts a delivery), going on with the scan
// where the last one stopped; a scan that reached the end waits for the
// block time before the next. It reads the delivery count of each entry it
// took from the pending entry list, and logs the entries the scan dropped
// because the stream no longer has them (trimmed or deleted while pending).
func (r *runner) claim(ctx context.Context, n int) ([]*Message, error) {
	var msgs []*Message
	for calls := 0; len(msgs) < n && calls < maxScanCalls; calls++ {
		xs, next, deleted, err := r.rdb.XAutoClaimWithDeleted(ctx, &redis.XAutoClaimArgs{
			Stream: r.stream, Group: r.group, Consumer: r.cfg.name, MinIdle: r.cfg.claimIdle,
			Start: r.cursor, Count: int64(n - len(msgs)),
		}).Result()
		if err != nil {
			return r.count(ctx, msgs, fmt.Errorf("XAUTOCLAIM: %w", err))
		}
		if len(deleted) > 0 {
			r.log.Warn("redisstreamdedup: pending entries no longer in the stream (trimmed or deleted before they were acknowledged) dropped from the pending entry list; they cannot be handled",
				slog.Any("entries", deleted))
		}
		for _, x := range xs {
			msgs = append(msgs, &Message{XMessage: x, Stream: r.stream, Group: r.group})
		}
		r.cursor = next
		if next == scanStart {
			r.lastScan = time.Now()
			break
		}
	}
	return r.count(ctx, msgs, nil)
}

// count sets the delivery count of msgs, taken over, from the pending
// entry list (XPENDING's, one pipelined call each). An entry whose count
// cannot be read is given back at once, and err, or the read's failure,
// returned; one no longer pending (acknowledged meanwhile) is left out.
func (r *runner) count(ctx context.Context, msgs []*Message, err error) ([]*Message, error) {
	if len(msgs) == 0 {
		return nil, err
	}
	cmds := make([]*redis.XPendingExtCmd, len(msgs))
	_, _ = r.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range msgs {
			cmds[i] = p.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: r.stream, Group: r.group, Start: m.ID, End: m.ID, Count: 1})
		}
		return nil
	})
	counted := msgs[:0]
	var back []givenBack
	for i, m := range msgs {
		pel, cerr := cmds[i].Result()
		switch {
		case cerr != nil:
			back = append(back, givenBack{id: m.ID})
			if err == nil {
				err = fmt.Errorf("XPENDING %s: %w", m.ID, cerr)
			}
			continue
		case len(pel) == 0:
			continue // acknowledged meanwhile, by a consumer that stalled past the claim idle time
		}
		m.DeliveredCount = pel[0].RetryCount
		counted = append(counted, m)
	}
	r.giveBack(back)
	return counted, err
}

// givenBack is an entry given back, to come again after delay.
type givenBack struct {
	id    string
	delay time.Duration
}

// giveBack sets the idle time of each entry to the claim idle time less
// its delay (none for a delay as long or longer), so that a scan takes it
// over once the delay is over; XCLAIM JUSTID does not count a delivery.
func (r *runner) giveBack(entries []givenBack) {
	if len(entries) == 0 {
		return
	}
	cmds, err := r.rdb.Pipelined(r.BG, func(p redis.Pipeliner) error {
		for _, e := range entries {
			idle := max(r.cfg.claimIdle-e.delay, 0)
			p.Do(r.BG, "XCLAIM", r.stream, r.group, r.cfg.name, 0, e.id, "IDLE", idle.Milliseconds(), "JUSTID")
		}
		return nil
	})
	if err != nil {
		r.log.Warn("redisstreamdedup: entries not given back; they come back once idle for the claim idle time",
			slog.Int("entries", len(cmds)), slog.Any("error", err))
	}
}

// touch resets the idle time of held entries (XCLAIM JUSTID to this
// consumer, which does not count a delivery), so that no other consumer
// takes them over while they are handled.
func (r *runner) touch(ctx context.Context, msgs []*Message) {
	args := []any{"XCLAIM", r.stream, r.group, r.cfg.name, 0}
	for _, m := range msgs {
		args = append(args, m.ID)
	}
	if err := r.rdb.Do(ctx, append(args, "JUSTID")...).Err(); err != nil && ctx.Err() == nil {
		r.log.Warn("redisstreamdedup: heartbeat not sent; these entries may be taken over while held",
			slog.Int("entries", len(msgs)), slog.Any("error", err))
	}
}
