package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// Complete marks the record succeeded, keeping result, if owner still holds
// it; otherwise it returns an error matching [dedup.ErrLeaseLost]. On a
// single node, completions made at the same time by concurrent callers
// share one script call (see coalescer).
func (s *Store) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: complete %s: %w", key, err)
	}
	c := deduptype.Completion{Key: key, Owner: owner, Result: result, TTL: ttl}
	if s.sharded {
		return s.completeEach(ctx, "complete", []deduptype.Completion{c})[0]
	}
	_, err := s.completions.do(ctx, c)
	return err
}

// CompleteBatch does what Complete does for each completion, in one round
// trip: one script call per 256 keys on a single node, one per key on a
// sharded client.
func (s *Store) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	for i := range cs {
		if err := cs[i].Key.Validate(); err != nil {
			return nil, err
		}
	}
	if len(cs) == 0 {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("redisstore: complete batch: %w", err)
		}
		return []error{}, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redisstore: complete batch %s: %w", cs[0].Key, err)
	}
	errs := s.completeEach(ctx, "complete batch", cs)
	for _, err := range errs {
		if err != nil && !errors.Is(err, dedup.ErrLeaseLost) {
			// Some calls may have landed: the caller must take none as done.
			return nil, err
		}
	}
	return errs, nil
}

// completeEach completes cs, valid keys, in order, in one round trip, and
// answers each on its own: nil, an error matching [dedup.ErrLeaseLost], or
// the error of the script call that carried it.
func (s *Store) completeEach(ctx context.Context, op string, cs []deduptype.Completion) []error {
	hasResult := func(c deduptype.Completion) string {
		if c.Result != nil {
			return "1"
		}
		return "0"
	}
	calls := s.calls(completeScript, len(cs), 5,
		func(i int) string { return redisKey(s.prefix, cs[i].Key) },
		func(i int, cmd []any) []any {
			return append(cmd, cs[i].Owner, newNonce(), cs[i].TTL.Milliseconds(), hasResult(cs[i]), cs[i].Result)
		})
	errs := make([]error, len(cs))
	i := 0
	for ci, cmd := range s.run(ctx, completeScript, calls) {
		n := calls[ci].n
		oks, err := cmd.Int64Slice()
		if err == nil && len(oks) != n {
			err = fmt.Errorf("%w: %d replies for %d keys", dedup.ErrMalformedRecord, len(oks), n)
		}
		for j := range n {
			if err != nil {
				errs[i+j] = fmt.Errorf("redisstore: %s %s: %w", op, cs[i+j].Key, err)
				continue
			}
			errs[i+j] = refused("complete", cs[i+j].Key, oks[j], nil)
		}
		i += n
	}
	return errs
}

// Fail records a failed attempt if owner still holds the record; otherwise
// it returns an error matching [dedup.ErrLeaseLost].
func (s *Store) Fail(ctx context.Context, key dedup.Key, owner string, f dedup.Failure) error {
	status := dedup.StatusFailedRetryable
	if f.Final {
		status = dedup.StatusFailedFinal
	}
	return s.settle(ctx, "fail", key, failScript.Run, owner, newNonce(), string(status), f.Error, f.TTL.Milliseconds())
}

// Extend pushes the lease of a held record to lease from now, or returns an
// error matching [dedup.ErrLeaseLost].
func (s *Store) Extend(ctx context.Context, key dedup.Key, owner string, lease time.Duration) error {
	return s.settle(ctx, "extend", key, extendScript.Run, owner, lease.Milliseconds())
}

// Release gives back a claim whose handler never started: the key can be
// claimed again at once and the attempt is not counted. It returns an error
// matching [dedup.ErrLeaseLost] if owner no longer holds the record.
func (s *Store) Release(ctx context.Context, key dedup.Key, owner string) error {
	return s.settle(ctx, "release", key, releaseScript.Run, owner, newNonce())
}

// settle runs a fenced single-key script, whose reply is 1 or 0.
func (s *Store) settle(ctx context.Context, op string, key dedup.Key, run scriptRun, args ...any) error {
	if err := key.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: %s %s: %w", op, key, err)
	}
	ok, err := run(ctx, s.client, []string{redisKey(s.prefix, key)}, args...).Int64()
	s.follow(err)
	return refused(op, key, ok, err)
}

// scriptRun is a script's Run method.
type scriptRun func(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd
