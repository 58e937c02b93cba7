package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
)

// redisPage is how many letters a Redis redrive reads at once.
const redisPage = 100

// redriveRedis sends the dead letters of a Redis stream back to the
// streams they came from (dedup-origin-stream). It reads the letters the
// stream held when it started, with XRANGE, so a dry run changes nothing,
// and deletes a letter (XDEL) once its copy is added to its origin stream.
// The copy has the letter's fields but the dedup-* metadata, and the
// redrive count one more; a letter of an event whose ID was its entry's
// (redisstreamdedup.WithEntryID) keeps its dedup-event-id, which such a
// consumer reads.
func redriveRedis(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive redis")
	addr := fs.String("redis", env("DEDUP_REDIS_ADDR", "127.0.0.1:6379"), "Redis address, host:port or a redis:// URL (DEDUP_REDIS_ADDR)")
	dlq := fs.String("dlq", "", "the dead-letter stream to drain, such as orders:dlq (required)")
	var r redrive
	if err := r.start(ctx, fs, args, "dlq"); err != nil {
		return err
	}
	defer r.close()
	opts := &redis.Options{Addr: *addr}
	if strings.Contains(*addr, "://") {
		var err error
		if opts, err = redis.ParseURL(*addr); err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	// Letters added after the start, sent back and parked again among
	// them, wait for the next run.
	lastEntries, err := rdb.XRevRangeN(ctx, *dlq, "+", "-", 1).Result()
	if err != nil {
		return fmt.Errorf("cannot read stream %s: %w", *dlq, err)
	}
	last, from := "", ""
	if len(lastEntries) > 0 {
		last, from = lastEntries[0].ID, "-"
	}
	next := func() ([]redis.XMessage, error) {
		if from == "" {
			return nil, nil
		}
		page, err := rdb.XRangeN(ctx, *dlq, from, last, redisPage).Result()
		if err != nil {
			return nil, fmt.Errorf("read %s from %s: %w", *dlq, from, err)
		}
		from = ""
		if len(page) == redisPage {
			from = "(" + page[len(page)-1].ID
		}
		return page, nil
	}
	return drain(ctx, &r, out, next, func(m redis.XMessage) error {
		sent, err := r.redisLetter(ctx, rdb, *dlq, m, out)
		if !sent || err != nil {
			return err
		}
		if err := rdb.XDel(context.WithoutCancel(ctx), *dlq, m.ID).Err(); err != nil {
			return fmt.Errorf("sent %s@%s back but could not delete it (a second redrive sends it again, and the consumer's dedup answers it): %w",
				*dlq, m.ID, err)
		}
		return nil
	})
}

// redisLetter redrives or skips one dead letter; sent reports that its
// origin stream has its copy.
func (r *redrive) redisLetter(ctx context.Context, rdb *redis.Client, dlq string, m redis.XMessage, out io.Writer) (sent bool, err error) {
	r.sum.read++
	field := func(name string) string {
		v, _ := m.Values[name].(string)
		return v
	}
	l := readLetter(dlq+"@"+m.ID, field)
	l.origin = field("dedup-origin-stream")
	if send, err := r.admit(ctx, l, "stream "+l.origin, out); !send {
		return false, err
	}
	values := make([]any, 0, 2*len(m.Values)+4)
	for k, v := range m.Values {
		if !strings.HasPrefix(k, dedup.MetadataPrefix) && k != redriveCountHeader {
			values = append(values, k, v)
		}
	}
	values = append(values, redriveCountHeader, strconv.Itoa(l.redrives+1))
	if id := field("dedup-event-id"); id != "" && id == field("dedup-origin-message-id") {
		values = append(values, "dedup-event-id", id) // the entry ID was the event ID
	}
	err = rdb.XAdd(ctx, &redis.XAddArgs{Stream: l.origin, NoMkStream: true, Values: values}).Err()
	if errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("send %s back: its origin stream %s does not exist", l.key, l.origin)
	}
	if err != nil {
		return false, fmt.Errorf("send %s back to stream %s: %w", l.key, l.origin, err)
	}
	r.sum.sent++
	return true, nil
}
