// Package redisstreamoutbox publishes outbox events to Redis Streams: one
// entry per event (XADD), added to the stream its destination names, with
// the event's ID in the "id" field, where redisstreamdedup reads it, its
// payload in "payload", its key in "event-key" ([KeyField]), its tenant in
// "tenant" and its headers as more fields. A relay that publishes an event
// again (it died before marking the row sent) adds a second entry, which
// the consumer's wrapper answers as a duplicate.
//
// The streams are not trimmed: add MAXLEN or MINID trimming of your own
// (XTRIM), no further than every group has acknowledged.
//
//	pub, _ := redisstreamoutbox.NewPublisher(rdb)
//	relay, _ := outbox.NewRelay(ob, pgConfig, pub)
//	err := relay.Run(ctx)
package redisstreamoutbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/group"
	"github.com/dedupkit/dedup/internal/wire"
	"github.com/dedupkit/dedup/outbox"
)

// IDField is the field carrying an event's ID: where redisstreamdedup's
// Messages reads it by default.
const IDField = wire.RedisIDField

// PayloadField is the field carrying an event's payload: where
// redisstreamdedup's Messages reads it by default.
const PayloadField = wire.RedisPayloadField

// KeyField is the field carrying an event's key (outbox.Event.Key) as it
// is, when it has one; Redis fields are binary-safe.
const KeyField = "event-key"

// TenantField is the field carrying an event's tenant, when it has one.
const TenantField = wire.TenantHeader

// Publisher publishes outbox events with a Redis client.
type Publisher struct {
	rdb redis.UniversalClient
}

// NewPublisher returns a publisher adding entries with rdb, which it does
// not close.
func NewPublisher(rdb redis.UniversalClient) (*Publisher, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: redisstreamoutbox: nil Redis client", dedup.ErrConfig)
	}
	return &Publisher{rdb: rdb}, nil
}

// Publish adds events to their streams and reports each one's result once
// Redis has added it. The events of one destination and key are added in
// order, each in a round after the previous one was added: a round is one
// pipeline holding the next event of every key (and every event without a
// key in the first), so a batch takes as many round trips as its longest
// key has events. Once an event fails for a reason worth retrying, the
// later ones of its key are left unsent (outbox.ErrNotAttempted), so that
// none overtakes it.
//
// Errors no retry can fix are permanent (dedup.Permanent), failing the row
// at once: an empty destination, and a destination key holding something
// other than a stream (WRONGTYPE).
func (p *Publisher) Publish(ctx context.Context, events []outbox.Event) []error {
	errs := make([]error, len(events))
	idx := make([]int, len(events))
	for i := range idx {
		idx[i] = i
	}
	chains := group.By(idx, func(i int) chainKey {
		if e := &events[i]; len(e.Key) > 0 {
			return chainKey{destination: e.Destination, key: string(e.Key)}
		}
		return chainKey{alone: i + 1}
	})
	for len(chains) > 0 {
		round := make([]int, len(chains))
		for c, chain := range chains {
			round[c] = chain[0]
		}
		p.add(ctx, events, round, errs)
		next := chains[:0]
		for _, chain := range chains {
			i := chain[0]
			if errs[i] != nil && !dedup.IsPermanent(errs[i]) {
				for _, later := range chain[1:] {
					errs[later] = outbox.ErrNotAttempted
				}
				continue
			}
			if len(chain) > 1 {
				next = append(next, chain[1:])
			}
		}
		chains = next
	}
	return errs
}

// chainKey identifies the events published one after the other: those of
// one destination and key. An event without a key is alone in its chain:
// alone is its index plus one.
type chainKey struct {
	destination, key string
	alone            int
}

// add adds the events at idx, of different keys, in one pipeline, and
// sets their errors.
func (p *Publisher) add(ctx context.Context, events []outbox.Event, idx []int, errs []error) {
	if err := ctx.Err(); err != nil {
		for _, i := range idx {
			errs[i] = fmt.Errorf("redisstreamoutbox: event %s not sent: %w", events[i].ID, context.Cause(ctx))
		}
		return
	}
	cmds := make(map[int]*redis.StringCmd, len(idx))
	_, _ = p.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for _, i := range idx {
			e := &events[i]
			if e.Destination == "" {
				errs[i] = dedup.Permanent(fmt.Errorf("redisstreamoutbox: event %s: empty destination", e.ID))
				continue
			}
			cmds[i] = pl.XAdd(ctx, &redis.XAddArgs{Stream: e.Destination, Values: fields(e)})
		}
		return nil
	})
	for i, cmd := range cmds {
		errs[i] = classify(&events[i], cmd.Err())
	}
}

// classify wraps the error of an XADD of e, marking those no retry fixes
// as permanent.
func classify(e *outbox.Event, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("redisstreamoutbox: add %s to %q: %w", e.ID, e.Destination, err)
	var rerr redis.Error
	if errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE") {
		return dedup.Permanent(err)
	}
	return err
}

// fields returns the entry of an event: its ID, payload, key and tenant,
// then its headers but those naming one of these.
func fields(e *outbox.Event) []any {
	f := []any{IDField, e.ID, PayloadField, e.Payload}
	if len(e.Key) > 0 {
		f = append(f, KeyField, e.Key)
	}
	if e.Tenant != "" {
		f = append(f, TenantField, e.Tenant)
	}
	for _, h := range e.Headers {
		switch h.Key {
		case IDField, PayloadField, KeyField, TenantField:
			continue // the event's own win
		}
		f = append(f, h.Key, h.Value)
	}
	return f
}
