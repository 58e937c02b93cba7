package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dedupkit/dedup"
)

// redriveCountHeader counts the redrives of a message (a Kafka, RabbitMQ or
// NATS header, an SQS attribute). It is not a dedup-* name: a dead letter's dedup-*
// metadata is replaced each time it is dead-lettered, and the count must
// survive that.
const redriveCountHeader = "x-dedup-redrive-count"

func runRedrive(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: dedup redrive kafka|sqs|kinesis|amqp|nats|pubsub|redis [flags]", errUsage)
	}
	if isHelp(args[0]) {
		return help(os.Stderr, "dedup redrive kafka|sqs|kinesis|amqp|nats|pubsub|redis [flags]: send dead letters back to their origin",
			"kafka", "from a Kafka dead-letter topic to the topics they came from",
			"sqs", "from an SQS dead-letter queue to the queues they came from",
			"kinesis", "from an SQS dead-letter queue of Lambda Kinesis handlers to the streams they came from",
			"amqp", "from a RabbitMQ dead-letter queue to the queues they came from",
			"nats", "from a NATS JetStream dead-letter stream to the subjects they came from",
			"pubsub", "from a subscription of a Pub/Sub dead-letter topic to the topics they came from",
			"redis", "from a Redis dead-letter stream to the streams they came from")
	}
	switch args[0] {
	case "kafka":
		return redriveKafka(ctx, args[1:], out)
	case "sqs":
		return redriveSQS(ctx, args[1:], out)
	case "kinesis":
		return redriveKinesis(ctx, args[1:], out)
	case "amqp":
		return redriveAMQP(ctx, args[1:], out)
	case "nats":
		return redriveNATS(ctx, args[1:], out)
	case "pubsub":
		return redrivePubSub(ctx, args[1:], out)
	case "redis":
		return redriveRedis(ctx, args[1:], out)
	}
	return fmt.Errorf("%w: dedup redrive kafka|sqs|kinesis|amqp|nats|pubsub|redis, not %q", errUsage, args[0])
}

// redrive is what every redrive shares: the filters, the loop guard, the
// reset of each event's record, the pace, the progress and the summary.
type redrive struct {
	stores      storeFlags
	reasons     string
	chosen      []string // reasons, split once
	minAge      time.Duration
	maxRedrives int
	rate        float64
	yes         bool

	store   dedup.Store
	admin   dedup.Admin
	closeFn func()
	tick    *time.Ticker
	sum     summary
	lastLog time.Time
}

func (r *redrive) register(fs *flag.FlagSet) {
	r.stores.register(fs, false)
	fs.StringVar(&r.reasons, "reason", "", "only dead letters of these reasons, comma-separated (handler-error, permanent, panic, crash-loop, ...)")
	fs.DurationVar(&r.minAge, "min-age", 0, "only dead letters whose last failure is at least this old")
	fs.IntVar(&r.maxRedrives, "max-redrives", 3, "skip a message already redriven this many times (the loop guard)")
	fs.Float64Var(&r.rate, "rate", 0, "messages sent back per second at most (0: no limit)")
	fs.BoolVar(&r.yes, "yes", false, "do it (default: list what would be redriven)")
}

// start registers r's flags on fs, beside the source's own registered
// already, parses args, checks that the flag named required is set, and
// opens the store.
func (r *redrive) start(ctx context.Context, fs *flag.FlagSet, args []string, required string) error {
	r.register(fs)
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if fs.Lookup(required).Value.String() == "" {
		return fmt.Errorf("%w: -%s is required", errUsage, required)
	}
	return r.open(ctx)
}

// open checks the flags and opens the store whose records are reset.
func (r *redrive) open(ctx context.Context) error {
	if r.maxRedrives < 1 || r.rate < 0 || r.minAge < 0 {
		return fmt.Errorf("%w: -max-redrives must be positive, -rate and -min-age not negative", errUsage)
	}
	if r.reasons != "" {
		r.chosen = strings.Split(r.reasons, ",")
	}
	var err error
	if r.store, r.admin, r.closeFn, err = r.stores.openAdmin(ctx); err != nil {
		return err
	}
	if r.rate > 0 {
		r.tick = time.NewTicker(time.Duration(float64(time.Second) / r.rate))
	}
	r.sum.skipped = map[string][]string{}
	return nil
}

func (r *redrive) close() {
	if r.tick != nil {
		r.tick.Stop()
	}
	if r.closeFn != nil {
		r.closeFn()
	}
}

// drain redrives the dead letters next reads, batch after batch, each
// through send, until next reads none or ctx is done, then prints the
// summary.
func drain[M any](ctx context.Context, r *redrive, out io.Writer, next func() ([]M, error), send func(M) error) error {
	for {
		batch, err := next()
		if ctx.Err() != nil {
			r.sum.print(out, !r.yes)
			return interrupted(ctx)
		}
		if err != nil {
			return err
		}
		if len(batch) == 0 {
			r.sum.print(out, !r.yes)
			return nil
		}
		for _, m := range batch {
			if err := send(m); err != nil {
				r.sum.print(out, !r.yes)
				if ctx.Err() != nil {
					return interrupted(ctx)
				}
				return err
			}
			r.progress()
		}
	}
}

func interrupted(ctx context.Context) error {
	return fmt.Errorf("interrupted: run it again to resume: %w", ctx.Err())
}

// letter is what a redrive reads of one dead letter.
type letter struct {
	where       string // for the summary: topic/partition@offset, message ID, queue#n or stream@sequence
	key         dedup.Key
	origin      string
	reason      string
	lastFailure time.Time
	redrives    int
}

// admit takes letter l through what every redrive does before sending it
// back to dest (its origin, as the dry run's line names it): skipped by a
// filter or the loop guard, listed in a dry run, or paced and its record
// reset so that the copy is claimable. It reports whether the caller sends
// it; the caller counts it sent once it is.
func (r *redrive) admit(ctx context.Context, l letter, dest string, out io.Writer) (send bool, err error) {
	if why := r.skip(l); why != "" {
		r.sum.skip(why, l.where)
		return false, nil
	}
	if !r.yes {
		fmt.Fprintf(out, "would send %s (%s, %s) back to %s\n", l.key, l.reason, l.where, dest)
		r.sum.sent++
		return false, nil
	}
	if !r.pace(ctx) {
		return false, ctx.Err()
	}
	if err := r.reset(ctx, l); err != nil {
		return false, fmt.Errorf("reset %s: %w", l.key, err)
	}
	return true, nil
}

// readLetter reads a dead letter's metadata (dedup-* names) and its redrive
// count.
func readLetter(where string, meta func(name string) string) letter {
	l := letter{where: where, key: dedup.Key{Scope: meta("dedup-scope"), EventID: meta("dedup-event-id")},
		reason: meta("dedup-reason")}
	l.lastFailure, _ = time.Parse(time.RFC3339Nano, meta("dedup-last-failure"))
	l.redrives, _ = strconv.Atoi(meta(redriveCountHeader))
	return l
}

// skip returns why l is not redriven, or "".
func (r *redrive) skip(l letter) string {
	switch {
	case l.origin == "":
		return "no origin in its metadata"
	case l.key.EventID == "" || l.key.Scope == "":
		return "no event ID or scope in its metadata"
	case l.redrives >= r.maxRedrives:
		return fmt.Sprintf("redriven %d times already (-max-redrives)", l.redrives)
	case r.chosen != nil && !slices.Contains(r.chosen, l.reason):
		return "reason " + l.reason + " not chosen (-reason)"
	case r.minAge > 0 && time.Since(l.lastFailure) < r.minAge:
		return "younger than -min-age"
	}
	return ""
}

// reset makes l's event run again when it is delivered: its record, parked
// for good, is forgotten. A record that succeeded since stays: the message
// sent back is then a duplicate.
func (r *redrive) reset(ctx context.Context, l letter) error {
	rec, err := r.store.Get(ctx, l.key)
	if errors.Is(err, dedup.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if rec.Status != dedup.StatusFailedFinal {
		return nil
	}
	_, err = r.admin.Forget(ctx, l.key, rec.Owner)
	return err
}

// pace waits for the rate limit; false when ctx is done.
func (r *redrive) pace(ctx context.Context) bool {
	if r.tick == nil {
		return ctx.Err() == nil
	}
	select {
	case <-r.tick.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// progress writes a progress line to stderr every few seconds.
func (r *redrive) progress() {
	if time.Since(r.lastLog) < 2*time.Second {
		return
	}
	r.lastLog = time.Now()
	verb := "sent back"
	if !r.yes {
		verb = "would send back" // a dry run
	}
	fmt.Fprintf(os.Stderr, "redrive: %d read, %d %s, %d skipped\n", r.sum.read, r.sum.sent, verb, r.sum.skips())
}

// summary counts what a redrive did.
type summary struct {
	read, sent int
	skipped    map[string][]string // why -> where
}

func (s *summary) skip(why, where string) { s.skipped[why] = append(s.skipped[why], where) }

func (s *summary) skips() int {
	n := 0
	for _, w := range s.skipped {
		n += len(w)
	}
	return n
}

func (s *summary) print(out io.Writer, dry bool) {
	verb := "sent back"
	if dry {
		verb = "would send back"
	}
	fmt.Fprintf(out, "%d dead letters read, %s %d, skipped %d\n", s.read, verb, s.sent, s.skips())
	whys := make([]string, 0, len(s.skipped))
	for why := range s.skipped {
		whys = append(whys, why)
	}
	slices.Sort(whys)
	for _, why := range whys {
		where := s.skipped[why]
		more := ""
		if len(where) > 10 {
			where, more = where[:10], fmt.Sprintf(" and %d more", len(s.skipped[why])-10)
		}
		fmt.Fprintf(out, "  skipped %d: %s: %s%s\n", len(s.skipped[why]), why, strings.Join(where, ", "), more)
	}
	if dry {
		fmt.Fprintln(out, "dry run: nothing sent, nothing reset; run with -yes")
	}
}
