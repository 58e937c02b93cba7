package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// Inputs that would break a careless layout: separators, braces (hash
// tags), escapes, spaces, Lua metacharacters and script text.
var awkward = []string{
	"a:b", "a", "b:c", "a%3Ab", "a%b", "{a}", "{", "}", "}{", "{}", "a b", " ",
	"%", "%25", "%7B", "')) redis.call('FLUSHALL') --", "]]--[[", "\\", "\"", "#", "$1", "é{ü}",
	strings.Repeat("{", dedup.MaxIDLen), strings.Repeat(":", dedup.MaxIDLen), strings.Repeat("%", dedup.MaxIDLen),
}

func TestKeyLayoutIsInjective(t *testing.T) {
	seen := map[string]dedup.Key{}
	for _, scope := range awkward {
		for _, id := range awkward {
			k := dedup.Key{Scope: scope, EventID: id}
			rk := redisKey("p:", k)
			if other, dup := seen[rk]; dup {
				t.Fatalf("%q and %q share the Redis key %q", k, other, rk)
			}
			seen[rk] = k
			tag := rk[len("p:"):]
			require.True(t, tag[0] == '{' && tag[len(tag)-1] == '}', rk)
			require.Equal(t, 1, strings.Count(rk, "{"), "one hash tag, spanning the key: %q", rk)
			require.Equal(t, 1, strings.Count(rk, "}"), "one hash tag, spanning the key: %q", rk)
			require.Equal(t, 1, strings.Count(tag, ":"), "one separator: %q", rk)
		}
	}
	require.Equal(t, "dedup:{orders%3Av1:evt-1}", redisKey(DefaultKeyPrefix, dedup.Key{Scope: "orders:v1", EventID: "evt-1"}))
}

// Every awkward scope and ID is a key of its own in a real Redis: claimed,
// completed and read back as itself, independent of its look-alikes.
func TestAwkwardKeys(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		run := deduptype.NewOwnerToken()[:8]
		sentinel := "redisstore-sentinel-" + run
		require.NoError(t, client.Set(ctx, sentinel, "x", time.Hour).Err())
		var reqs []dedup.ClaimRequest
		for _, scope := range awkward {
			for _, id := range awkward {
				scope := (run + scope)[:min(len(run)+len(scope), dedup.MaxIDLen)]
				reqs = append(reqs, dedup.ClaimRequest{Key: dedup.Key{Scope: scope, EventID: id}, Fingerprint: scope + id, Lease: time.Minute, TTL: time.Hour})
			}
		}
		claims, err := s.ClaimBatch(ctx, reqs)
		require.NoError(t, err)
		for i, c := range claims {
			require.Equal(t, dedup.ClaimAcquired, c.Status, "%q", reqs[i].Key)
			require.Equal(t, 1, c.Record.Attempts, "%q", reqs[i].Key)
		}
		for i, c := range claims {
			require.NoError(t, s.Complete(ctx, c.Record.Key, c.Record.Owner, []byte(reqs[i].Fingerprint), time.Hour))
		}
		for _, r := range reqs {
			rec, err := s.Get(ctx, r.Key)
			require.NoError(t, err)
			require.Equal(t, r.Key, rec.Key)
			require.Equal(t, r.Fingerprint, rec.Fingerprint)
			require.Equal(t, []byte(r.Fingerprint), rec.Result)
			c, err := s.Claim(ctx, r)
			require.NoError(t, err)
			require.Equal(t, dedup.ClaimDuplicate, c.Status, "%q", r.Key)
		}
		n, err := client.Exists(ctx, sentinel).Result()
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "no input ran as script text")
	})
}

func TestNewRejectsBadConfiguration(t *testing.T) {
	for name, client := range map[string]redis.UniversalClient{
		"nil":               nil,
		"typed nil client":  (*redis.Client)(nil),
		"typed nil cluster": (*redis.ClusterClient)(nil),
	} {
		_, err := New(client)
		require.ErrorIs(t, err, dedup.ErrConfig, name)
	}
	client := redis.NewClient(&redis.Options{Addr: testenv.ClosedPort(t)})
	defer client.Close()
	for _, prefix := range []string{"{", "a}", "{tag}:"} {
		_, err := New(client, WithKeyPrefix(prefix))
		require.ErrorIs(t, err, dedup.ErrConfig, prefix)
	}
	s, err := New(client, WithKeyPrefix(""))
	require.NoError(t, err)
	require.False(t, s.sharded, "a *redis.Client is one node")
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{testenv.ClosedPort(t)}})
	defer cluster.Close()
	s, err = New(cluster)
	require.NoError(t, err)
	require.True(t, s.sharded)
}

// A record that is not one (written by something else under the store's
// prefix) is reported, never decoded into an answer; a batch meeting one
// gives back what it claimed.
func TestMalformedRecord(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		scope := "redisstore-malformed-" + deduptype.NewOwnerToken()
		bad := map[string]func(key string) error{
			"attempts": func(key string) error {
				return client.HSet(ctx, key, "st", "SUCCEEDED", "fp", "fp", "at", "one", "lu", 1, "ea", 1<<50).Err()
			},
			"status": func(key string) error {
				return client.HSet(ctx, key, "st", "DONE", "fp", "fp", "at", 1, "ow", "o", "lu", 1, "ca", 1, "ua", 1, "ea", 1<<50).Err()
			},
			"no expiry": func(key string) error { return client.HSet(ctx, key, "fp", "fp").Err() },
			// A record kept as a string is a MessagePack array (packed.go).
			"not packed": func(key string) error { return client.Set(ctx, key, "x", time.Hour).Err() },
			"cut short":  func(key string) error { return client.Set(ctx, key, "\x9d\xa9SUCCEEDED", time.Hour).Err() },
			"few values": func(key string) error {
				return client.Set(ctx, key, string(appendStr([]byte{0x92}, "SUCCEEDED"))+"\x01", time.Hour).Err()
			},
			"packed status": func(key string) error {
				b := appendStr([]byte{0x9d}, "DONE")
				b = appendStr(b, "fp")
				b = append(b, 1)
				b = appendStr(b, "o")
				b = append(b, 1, 1, 1, 0xcf, 0, 0, 0x10, 0, 0, 0, 0, 0) // lu ca ua, ea 2^44
				b = append(b, mpFalse, mpFalse, mpFalse, mpFalse, mpFalse)
				return client.Set(ctx, key, string(b), time.Hour).Err()
			},
		}
		for name, write := range bad {
			k := dedup.Key{Scope: scope, EventID: name}
			require.NoError(t, write(redisKey(s.prefix, k)))
			_, err := s.Claim(ctx, request(scope, name))
			require.ErrorIs(t, err, dedup.ErrMalformedRecord, name)
			_, err = s.Get(ctx, k)
			require.ErrorIs(t, err, dedup.ErrMalformedRecord, name)

			before, after := name+"-before", name+"-after"
			_, err = s.ClaimBatch(ctx, []dedup.ClaimRequest{request(scope, before), request(scope, name), request(scope, after)})
			require.ErrorIs(t, err, dedup.ErrMalformedRecord, name)
			for _, id := range []string{before, after} {
				c, err := s.Claim(ctx, request(scope, id))
				require.NoError(t, err)
				require.Equal(t, dedup.ClaimAcquired, c.Status, "%s was given back", id)
				require.Equal(t, 1, c.Record.Attempts, "%s: the failed batch counted no attempt", id)
			}
		}

		// Another type under the key: the server's own error, typed.
		k := dedup.Key{Scope: scope, EventID: "list"}
		require.NoError(t, client.RPush(ctx, redisKey(s.prefix, k), "x").Err())
		_, err := s.Claim(ctx, request(scope, "list"))
		require.True(t, redis.HasErrorPrefix(err, "WRONGTYPE"), "%v", err)
		_, err = s.Get(ctx, k)
		require.True(t, redis.HasErrorPrefix(err, "WRONGTYPE"), "%v", err)
	})
}

// go-redis sends a command again when its connection breaks before the
// answer, so a script may run twice. The second run recognises the first
// (same owner token, same settling nonce) instead of answering InFlight or
// ErrLeaseLost for a write that landed.
func TestScriptRunTwice(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	key := redisKey(DefaultKeyPrefix, dedup.Key{Scope: "redisstore-twice-" + deduptype.NewOwnerToken(), EventID: "e"})
	owner := deduptype.NewOwnerToken()
	for _, code := range []int64{2, 1} { // created, then recognised as held by this claim
		reply, err := claimScript.Run(ctx, client, []string{key}, "fp", 60000, 3600000, owner).Slice()
		require.NoError(t, err)
		require.Equal(t, code, reply[0])
	}
	for _, nonce := range []string{"n1", "n1"} {
		ok, err := completeScript.Run(ctx, client, []string{key}, owner, nonce, 3600000, "0", "").Int64Slice()
		require.NoError(t, err)
		require.Equal(t, []int64{1}, ok)
	}
	ok, err := completeScript.Run(ctx, client, []string{key}, owner, "n2", 3600000, "0", "").Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{0}, ok, "another completion by the same owner is refused")
	ok2, err := failScript.Run(ctx, client, []string{key}, owner, "n3", "FAILED_FINAL", "x", 3600000).Int64()
	require.NoError(t, err)
	require.Zero(t, ok2)
	v, err := client.Get(ctx, key).Result()
	require.NoError(t, err)
	rec, err := parsePacked(dedup.Key{Scope: "s", EventID: "e"}, v)
	require.NoError(t, err)
	require.Equal(t, dedup.StatusSucceeded, rec.Status)
}

// A claim's answer carries every field of the record it found as it is
// stored, whether the client speaks RESP2 or RESP3 (where a script's false
// is a boolean, no string): an absent result is nil, an empty one empty, a
// result "false" or "" is that text; an absent optional field is zero. The
// record is the one Get reads, in a batch too.
func TestClaimAnswerFields(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	for _, protocol := range []int{2, 3} {
		opts := *client.Options()
		opts.Protocol = protocol
		c := redis.NewClient(&opts)
		t.Cleanup(func() { c.Close() })
		s, err := New(c)
		require.NoError(t, err)
		scope := fmt.Sprintf("redisstore-answer-%d-%s", protocol, deduptype.NewOwnerToken())
		results := map[string][]byte{"nil": nil, "empty": {}, "false": []byte("false"), "zeros": {0, 0}}
		var reqs []dedup.ClaimRequest
		for id, result := range results {
			req := request(scope, id)
			cl, err := s.Claim(ctx, req)
			require.NoError(t, err)
			require.NoError(t, s.Complete(ctx, req.Key, cl.Record.Owner, result, time.Hour))
			reqs = append(reqs, req)
		}
		failed := request(scope, "failed")
		cl, err := s.Claim(ctx, failed)
		require.NoError(t, err)
		require.NoError(t, s.Fail(ctx, failed.Key, cl.Record.Owner, dedup.Failure{Final: true, Error: "false", TTL: time.Hour}))
		reqs = append(reqs, failed)

		batch, err := s.ClaimBatch(ctx, reqs)
		require.NoError(t, err)
		for i, req := range reqs {
			one, err := s.Claim(ctx, req)
			require.NoError(t, err)
			stored, err := s.Get(ctx, req.Key)
			require.NoError(t, err)
			for _, got := range []dedup.Claim{one, batch[i]} {
				require.Equal(t, stored, got.Record, "RESP%d %s", protocol, req.Key.EventID)
				if result, ok := results[req.Key.EventID]; ok {
					require.Equal(t, dedup.ClaimDuplicate, got.Status)
					require.Equal(t, result == nil, got.Record.Result == nil, "RESP%d %s", protocol, req.Key.EventID)
					require.Equal(t, string(result), string(got.Record.Result))
					require.True(t, got.Record.FirstFailure.IsZero())
				} else {
					require.Equal(t, dedup.ClaimFinal, got.Status)
					require.Equal(t, "false", got.Record.LastError)
					require.False(t, got.Record.FirstFailure.IsZero())
				}
			}
		}
	}
}

// A record settled by a version before settled records became one string
// is a hash: claims and Get still read it, result and all, until it
// expires.
func TestSettledHashOfEarlierVersion(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	s, err := New(client)
	require.NoError(t, err)
	scope := "redisstore-earlier-" + deduptype.NewOwnerToken()
	req := request(scope, "e")
	now := time.Now().UnixMilli()
	key := redisKey(s.prefix, req.Key)
	require.NoError(t, client.HSet(ctx, key, "st", "SUCCEEDED", "fp", req.Fingerprint, "at", 2, "ow", "o",
		"lu", now, "ca", now-1000, "ua", now, "ea", now+3600000, "le", "boom", "ff", now-900, "lf", now-800,
		"sn", "n", "rs", "answer").Err())
	require.NoError(t, client.PExpireAt(ctx, key, time.UnixMilli(now+3600000)).Err())

	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimDuplicate, c.Status)
	require.Equal(t, "answer", string(c.Record.Result))
	require.Equal(t, 2, c.Record.Attempts)
	require.Equal(t, "boom", c.Record.LastError)
	got, err := s.Get(ctx, req.Key)
	require.NoError(t, err)
	require.Equal(t, c.Record, got)

	other := req
	other.Fingerprint = "another"
	c, err = s.Claim(ctx, other)
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimConflict, c.Status)
}

// A claim's SET NX GET sent twice (go-redis sends a pipeline again when its
// connection breaks before the answer) finds the record its first run
// created: the script recognises the owner's own claim and resolves the
// record's relative times from the key's expiry, as Get does.
func TestSetNXRunTwice(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	s, err := New(client)
	require.NoError(t, err)
	req := request("redisstore-setnx-twice-"+deduptype.NewOwnerToken(), "e")
	key := redisKey(s.prefix, req.Key)
	owner := deduptype.NewOwnerToken()
	ok, err := client.SetNX(ctx, key, packNew(req, owner), req.TTL).Result()
	require.NoError(t, err)
	require.True(t, ok)
	ea, err := client.PExpireTime(ctx, key).Result()
	require.NoError(t, err)

	reply, err := claimScript.Run(ctx, client, []string{key}, req.Fingerprint, req.Lease.Milliseconds(), req.TTL.Milliseconds(), owner).Slice()
	require.NoError(t, err)
	require.Equal(t, int64(1), reply[0], "held already by this very claim")
	want := created(req, owner, ea.Milliseconds()).Record
	got, err := s.Get(ctx, req.Key)
	require.NoError(t, err)
	require.Equal(t, want, got)

	c, err := s.Claim(ctx, req)
	require.NoError(t, err)
	require.Equal(t, dedup.ClaimInFlight, c.Status, "another claim finds it held")
	require.Equal(t, want, c.Record)
}
