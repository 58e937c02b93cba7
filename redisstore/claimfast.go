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

// claimFast claims reqs as claimEach does, in one round trip of native
// commands where it can: each key gets SET NX GET of a new record, which
// creates it when the key is free and otherwise answers the record there,
// and PEXPIRETIME, which gives the server's time of a record created.
// A settled record is classified from that answer; only a key held or
// failed (which may be taken over), a hash, or a server without SET NX GET
// (before Redis 7.0) goes on to the claim script, in a second round trip.
func (s *Store) claimFast(ctx context.Context, op string, reqs []dedup.ClaimRequest) ([]dedup.Claim, []error) {
	if s.noSetGet.Load() {
		return s.claimEach(ctx, op, reqs)
	}
	tokens := deduptype.NewOwnerTokens(len(reqs), ' ')
	// sets[i] and expiries[i] are key i's SET NX GET and PEXPIRETIME.
	sets := make([]*redis.StringCmd, len(reqs))
	expiries := make([]*redis.IntCmd, len(reqs))
	cmds := make([]redis.Cmder, 0, 1+2*len(reqs))
	for i, req := range reqs {
		if req.TTL < time.Millisecond {
			continue // a TTL of zero deletes the record at once: the script's case
		}
		key := any(redisKey(s.prefix, req.Key))
		if len(cmds) == 0 {
			// go-redis takes the first command's error for the pipeline's
			// and weighs it for a retry, which allocates a score of
			// times: SET NX GET's answer for a new key (redis.Nil) would
			// be that error. PEXPIRETIME answers without one.
			cmds = append(cmds, redis.NewIntCmd(ctx, "pexpiretime", key))
		}
		sets[i] = redis.NewStringCmd(ctx, "set", key, packNew(req, tokens.At(i)), "px", req.TTL.Milliseconds(), "nx", "get")
		expiries[i] = redis.NewIntCmd(ctx, "pexpiretime", key)
		cmds = append(cmds, sets[i], expiries[i])
	}
	pipe := s.client.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...)
	if _, err := pipe.Exec(ctx); err != nil {
		s.follow(err)
	}
	claims := make([]dedup.Claim, len(reqs))
	errs := make([]error, len(reqs))
	var rest []int
	for i, set := range sets {
		if set == nil {
			rest = append(rest, i)
			continue
		}
		v, err := set.Result()
		switch {
		case errors.Is(err, redis.Nil):
			if ea, err := expiries[i].Result(); err == nil && ea > 0 {
				claims[i] = created(reqs[i], tokens.At(i), ea)
				continue
			}
			// Gone already (an operator's DEL): the script says what is there.
		case err == nil:
			if rec, err := parsePacked(reqs[i].Key, v); err == nil && settled(rec.Status) {
				claims[i] = dedup.Claim{Status: deduptype.Classify(rec, reqs[i].Fingerprint), Record: rec}
				continue
			}
		case redis.HasErrorPrefix(err, "WRONGTYPE"):
		case redis.HasErrorPrefix(err, "ERR syntax"):
			s.noSetGet.Store(true) // before Redis 7.0, SET takes NX or GET, not both
		default:
			errs[i] = fmt.Errorf("redisstore: %s %s: %w", op, reqs[i].Key, err)
			continue
		}
		rest = append(rest, i)
	}
	if len(rest) == 0 {
		return claims, errs
	}
	sub := make([]dedup.ClaimRequest, len(rest))
	for j, i := range rest {
		sub[j] = reqs[i]
	}
	subClaims, subErrs := s.claimEach(ctx, op, sub)
	for j, i := range rest {
		claims[i], errs[i] = subClaims[j], subErrs[j]
	}
	return claims, errs
}

// created returns the claim of req created under owner, whose key the
// server set to expire at ea (Unix ms): the record's times follow from it,
// as the scripts resolve those of a record SET NX created.
func created(req dedup.ClaimRequest, owner string, ea int64) dedup.Claim {
	now := time.UnixMilli(ea - req.TTL.Milliseconds())
	return dedup.Claim{Status: dedup.ClaimAcquired, Record: dedup.Record{
		Key: req.Key, Status: dedup.StatusProcessing, Fingerprint: req.Fingerprint, Attempts: 1, Owner: owner,
		LeaseUntil: now.Add(req.Lease), CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(req.TTL),
	}}
}

// settled reports whether st is a status no claim changes.
func settled(st dedup.Status) bool {
	return st == dedup.StatusSucceeded || st == dedup.StatusFailedFinal
}
