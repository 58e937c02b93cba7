package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

func request(scope, id string) dedup.ClaimRequest {
	return dedup.ClaimRequest{Key: dedup.Key{Scope: scope, EventID: id}, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
}

func newStore(t *testing.T, client redis.UniversalClient, sharded bool) *Store {
	t.Helper()
	s, err := New(client)
	require.NoError(t, err)
	s.sharded = sharded
	return s
}

// eachPath runs f on a store of client taking the single-node path and on
// one taking the sharded path (one script call per key, pipelined).
func eachPath(t *testing.T, client redis.UniversalClient, f func(t *testing.T, s *Store)) {
	for _, sharded := range []bool{false, true} {
		t.Run(fmt.Sprintf("sharded=%v", sharded), func(t *testing.T) { f(t, newStore(t, client, sharded)) })
	}
}

// requireRedisError requires err to carry the server's refusal, typed, with
// the store's context, and to be none of the answers the wrapper acts on.
func requireRedisError(t *testing.T, err error, is func(error) bool, what string) {
	t.Helper()
	require.Error(t, err, what)
	var rerr redis.Error
	require.ErrorAs(t, err, &rerr, what)
	require.True(t, is(err), "%s: %v", what, err)
	require.True(t, strings.HasPrefix(err.Error(), "redisstore: "), "%s: %v", what, err)
	for _, sentinel := range []error{dedup.ErrLeaseLost, dedup.ErrNotFound, dedup.ErrMalformedRecord, dedup.ErrInvalidKey} {
		require.NotErrorIs(t, err, sentinel, what)
	}
}

// refusingWrites checks a server that refuses writes: every write fails
// with the typed refusal and nothing changes; reads still answer.
func refusingWrites(t *testing.T, s *Store, held dedup.Claim, is func(error) bool) {
	t.Helper()
	ctx := context.Background()
	scope := held.Record.Key.Scope
	before, err := s.Get(ctx, held.Record.Key)
	require.NoError(t, err)

	_, err = s.Claim(ctx, request(scope, "new"))
	requireRedisError(t, err, is, "claim")
	_, err = s.ClaimBatch(ctx, []dedup.ClaimRequest{request(scope, "new-1"), request(scope, "new-2")})
	requireRedisError(t, err, is, "claim batch")
	requireRedisError(t, s.Complete(ctx, held.Record.Key, held.Record.Owner, []byte("r"), time.Hour), is, "complete")
	_, err = s.CompleteBatch(ctx, []deduptype.Completion{{Key: held.Record.Key, Owner: held.Record.Owner, TTL: time.Hour}})
	requireRedisError(t, err, is, "complete batch")
	requireRedisError(t, s.Fail(ctx, held.Record.Key, held.Record.Owner, dedup.Failure{Error: "x", TTL: time.Hour}), is, "fail")
	requireRedisError(t, s.Extend(ctx, held.Record.Key, held.Record.Owner, time.Hour), is, "extend")
	requireRedisError(t, s.Release(ctx, held.Record.Key, held.Record.Owner), is, "release")

	after, err := s.Get(ctx, held.Record.Key)
	require.NoError(t, err, "reads still answer")
	require.Equal(t, before, after, "nothing changed")
	for _, id := range []string{"new", "new-1", "new-2"} {
		_, err := s.Get(ctx, dedup.Key{Scope: scope, EventID: id})
		require.ErrorIs(t, err, dedup.ErrNotFound, id)
	}
}

// A server whose last snapshot failed refuses writes (MISCONF) while
// stop-writes-on-bgsave-error is on and it has save points.
func TestMISCONF(t *testing.T) {
	srv := testenv.StartRedisServer(t, "--enable-protected-configs", "yes")
	client := srv.Client()
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		held, err := s.Claim(ctx, request(t.Name(), "held"))
		require.NoError(t, err)

		// A snapshot into a directory that is gone fails.
		dir := filepath.Join(t.TempDir(), "gone")
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, client.ConfigSet(ctx, "dir", dir).Err())
		require.NoError(t, client.ConfigSet(ctx, "stop-writes-on-bgsave-error", "yes").Err())
		require.NoError(t, client.ConfigSet(ctx, "save", "3600 1").Err()) // the refusal needs save points
		require.NoError(t, os.Remove(dir))
		require.NoError(t, client.BgSave(ctx).Err())
		require.Eventually(t, func() bool {
			return strings.Contains(client.Info(ctx, "persistence").Val(), "rdb_last_bgsave_status:err")
		}, 10*time.Second, 20*time.Millisecond, "the snapshot fails")

		refusingWrites(t, s, held, func(err error) bool { return redis.HasErrorPrefix(err, "MISCONF") })

		require.NoError(t, client.ConfigSet(ctx, "stop-writes-on-bgsave-error", "no").Err())
		require.NoError(t, s.Complete(ctx, held.Record.Key, held.Record.Owner, nil, time.Hour), "writes resume")
	})
}

// A primary demoted to a replica (as after a failover) refuses writes
// (READONLY); its clients do not follow the new primary on their own.
func TestREADONLY(t *testing.T) {
	primary := testenv.StartRedisServer(t, "--repl-diskless-sync-delay", "0")
	srv := testenv.StartRedisServer(t)
	// go-redis retries READONLY; one try keeps the test short.
	client := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		// The replica copies the primary's data: hold a claim there.
		held, err := newStore(t, primary.Client(), false).Claim(ctx, request(t.Name(), "held"))
		require.NoError(t, err)
		host, port, _ := net.SplitHostPort(primary.Addr())
		require.NoError(t, client.ReplicaOf(ctx, host, port).Err())
		require.Eventually(t, func() bool {
			return strings.Contains(client.Info(ctx, "replication").Val(), "master_link_status:up")
		}, 10*time.Second, 20*time.Millisecond, "the replica syncs")

		refusingWrites(t, s, held, redis.IsReadOnlyError)

		require.NoError(t, client.ReplicaOf(ctx, "NO", "ONE").Err())
		require.NoError(t, s.Complete(ctx, held.Record.Key, held.Record.Owner, nil, time.Hour), "writes resume")
	})
}

// A server at maxmemory with noeviction refuses writes that need memory
// (OOM).
func TestOOM(t *testing.T) {
	srv := testenv.StartRedisServer(t, "--maxmemory-policy", "noeviction")
	client := srv.Client()
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		held, err := s.Claim(ctx, request(t.Name(), "held"))
		require.NoError(t, err)
		require.NoError(t, client.ConfigSet(ctx, "maxmemory", "1").Err())
		defer func() { require.NoError(t, client.ConfigSet(ctx, "maxmemory", "0").Err()) }()

		refusingWrites(t, s, held, redis.IsOOMError)
	})
}

// Flushing the script cache (as a restart or SCRIPT FLUSH does) costs one
// more round trip, not an error: EVALSHA's NOSCRIPT is answered by EVAL.
func TestNOSCRIPT(t *testing.T) {
	client := testenv.Redis(t)
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		scope := "redisstore-noscript-" + deduptype.NewOwnerToken()
		for i := range 3 {
			require.NoError(t, client.ScriptFlush(ctx).Err())
			c, err := s.Claim(ctx, request(scope, fmt.Sprint("one-", i)))
			require.NoError(t, err)
			require.Equal(t, dedup.ClaimAcquired, c.Status)

			require.NoError(t, client.ScriptFlush(ctx).Err())
			claims, err := s.ClaimBatch(ctx, []dedup.ClaimRequest{
				request(scope, fmt.Sprint("batch-", i)), request(scope, fmt.Sprint("one-", i)),
			})
			require.NoError(t, err)
			require.Equal(t, dedup.ClaimAcquired, claims[0].Status)
			require.Equal(t, 1, claims[0].Record.Attempts, "the batch ran once")
			require.Equal(t, dedup.ClaimInFlight, claims[1].Status)

			require.NoError(t, client.ScriptFlush(ctx).Err())
			errs, err := s.CompleteBatch(ctx, []deduptype.Completion{
				{Key: c.Record.Key, Owner: c.Record.Owner, TTL: time.Hour},
				{Key: claims[0].Record.Key, Owner: claims[0].Record.Owner, TTL: time.Hour},
			})
			require.NoError(t, err)
			require.Equal(t, []error{nil, nil}, errs)
			require.NoError(t, client.ScriptFlush(ctx).Err())
			require.ErrorIs(t, s.Release(ctx, c.Record.Key, c.Record.Owner), dedup.ErrLeaseLost)
		}
	})
}

// A connection cut while a call is on the wire (the server killed) is an
// error of the network kind, never an answer; once the server is back, the
// store works again without being rebuilt.
func TestConnectionCut(t *testing.T) {
	srv := testenv.StartRedisServer(t)
	// No retries: go-redis would otherwise retry into the refused dial.
	client := srv.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	admin := srv.Client()
	ctx := context.Background()
	eachPath(t, client, func(t *testing.T, s *Store) {
		scope := t.Name()
		held, err := s.Claim(ctx, request(scope, "held"))
		require.NoError(t, err)

		// Paused, the server reads the calls and answers none of them.
		require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", 60000, "WRITE").Err())
		calls := map[string]func() error{
			"claim": func() error { _, err := s.Claim(ctx, request(scope, "new")); return err },
			"claim batch": func() error {
				_, err := s.ClaimBatch(ctx, []dedup.ClaimRequest{request(scope, "b1"), request(scope, "b2")})
				return err
			},
			"complete": func() error { return s.Complete(ctx, held.Record.Key, held.Record.Owner, nil, time.Hour) },
			"complete batch": func() error {
				_, err := s.CompleteBatch(ctx, []deduptype.Completion{{Key: held.Record.Key, Owner: held.Record.Owner, TTL: time.Hour}})
				return err
			},
			"fail":    func() error { return s.Fail(ctx, held.Record.Key, held.Record.Owner, dedup.Failure{TTL: time.Hour}) },
			"extend":  func() error { return s.Extend(ctx, held.Record.Key, held.Record.Owner, time.Hour) },
			"release": func() error { return s.Release(ctx, held.Record.Key, held.Record.Owner) },
		}
		errs := make(chan error, len(calls))
		for name, call := range calls {
			go func() { errs <- fmt.Errorf("%s: %w", name, call()) }()
		}
		require.Eventually(t, func() bool {
			// A claim's first command is SET NX GET, the others' a script call.
			list := admin.ClientList(ctx).Val()
			return strings.Count(list, "cmd=evalsha")+strings.Count(list, "cmd=set ") >= len(calls)
		}, 10*time.Second, 10*time.Millisecond, "every call is on the wire")
		srv.Kill()
		for range calls {
			err := <-errs
			var nerr net.Error
			require.True(t, errors.Is(err, io.EOF) || errors.As(err, &nerr), "%v", err)
			require.Contains(t, err.Error(), "redisstore: ")
		}

		srv.Start()
		c, err := s.Claim(ctx, request(scope, "after"))
		require.NoError(t, err, "the store works once the server is back")
		require.Equal(t, dedup.ClaimAcquired, c.Status)
	})
}
