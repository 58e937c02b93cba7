// Package redisstore is a [dedup.Store] kept in Redis, over go-redis v9.
//
// Every record is one Redis hash, written only by Lua scripts that read the
// server's clock (TIME), so a claim and a takeover are one atomic step and a
// worker's clock skew cannot break a lease. Complete, Fail, Extend and
// Release are fenced on the owner token. Records expire through Redis key
// expiry (PEXPIREAT, from the server's clock), so [Store.Purge] has nothing
// to do.
//
// On a single node, the Claim and Complete calls that concurrent callers
// make at the same moment share one script call and one round trip, as a
// group commit does: a caller alone goes at once, and callers arriving
// while calls are in flight go together in the next one. Each is answered
// exactly as if it had been made alone (an HTTP middleware's requests, or a
// consumer's concurrent handlers, are such callers).
//
// The store accepts any [redis.UniversalClient]: a single node or a Sentinel
// failover client (*redis.Client), or Redis Cluster (*redis.ClusterClient).
// Keys are laid out so that a record never spans hash slots; see
// [WithKeyPrefix] for the layout. On a Cluster client the store makes the
// client reload the cluster's layout when a node refuses or cuts a
// connection or says the cluster is changing, so that it follows a
// failover within a second of the promotion rather than at the client's
// next periodic reload.
//
// Durability is the server's: Redis acknowledges a write before it is on
// disk unless AOF runs with appendfsync always, and before any replica has it
// (replication is asynchronous). A record acknowledged and then lost to a
// restart or failover lets its event run a second time. The README's
// "Choosing a backend" table states what each configuration guarantees.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// Store is a [dedup.Store] kept in Redis. It is safe for concurrent use.
type Store struct {
	client redis.UniversalClient
	prefix string
	// sharded is set for clients that spread keys over several servers
	// (Cluster, Ring): a script then touches one key only.
	sharded bool
	// cluster is the client when it is a Redis Cluster client: it is told
	// to reload the cluster's layout when a node is gone (see follow).
	cluster *redis.ClusterClient
	// claims and completions coalesce concurrent single calls on a
	// single node; a sharded client's keys may live apart, and its calls
	// go alone.
	claims      *coalescer[dedup.ClaimRequest, dedup.Claim]
	completions *coalescer[deduptype.Completion, struct{}]
	// noSetGet is set once the server refuses SET NX GET (before Redis
	// 7.0): claims then go by script alone.
	noSetGet atomic.Bool
}

// coalescedFlights is how many coalesced calls of one kind may be in
// flight at once: more lets a few callers' claims overlap, fewer makes
// the batches of many callers larger. Since a claim is native commands,
// one is faster (BENCHMARKS.md: a replay missing the cache 0.63x of a bare
// handler against 0.60x with two, a new key level).
const coalescedFlights = 1

var (
	_ dedup.Store              = (*Store)(nil)
	_ deduptype.BatchCompleter = (*Store)(nil)
)

// Opt configures a [Store].
type Opt interface{ apply(*config) }

type optFunc func(*config)

func (f optFunc) apply(c *config) { f(c) }

type config struct {
	prefix string
}

// WithKeyPrefix sets the string every key starts with (default
// [DefaultKeyPrefix], "dedup:"), to keep several applications or
// environments apart in one Redis. The record of a key lives at
//
//	<prefix>{<scope>:<event ID>}
//
// with %, :, { and } in scope and event ID escaped as %25, %3A, %7B and
// %7D, so that no input can collide with another key or form a hash tag of
// its own. The part in braces is the Cluster hash tag. The prefix must not
// contain braces.
func WithKeyPrefix(prefix string) Opt {
	return optFunc(func(c *config) { c.prefix = prefix })
}

// New returns a store on client. The client stays the caller's: closing it
// is the caller's job.
func New(client redis.UniversalClient, opts ...Opt) (*Store, error) {
	if client == nil || reflect.ValueOf(client).Kind() == reflect.Pointer && reflect.ValueOf(client).IsNil() {
		return nil, fmt.Errorf("%w: redisstore.New: nil client", dedup.ErrConfig)
	}
	cfg := config{prefix: DefaultKeyPrefix}
	for _, o := range opts {
		o.apply(&cfg)
	}
	if strings.ContainsAny(cfg.prefix, "{}") {
		return nil, fmt.Errorf("%w: redisstore.WithKeyPrefix(%q): must not contain braces", dedup.ErrConfig, cfg.prefix)
	}
	_, single := client.(*redis.Client)
	cluster, _ := client.(*redis.ClusterClient)
	s := &Store{client: client, prefix: cfg.prefix, sharded: !single, cluster: cluster}
	s.claims = &coalescer[dedup.ClaimRequest, dedup.Claim]{max: coalescedFlights,
		run: func(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, []error) {
			return s.claimFast(ctx, "claim", reqs)
		}}
	s.completions = &coalescer[deduptype.Completion, struct{}]{max: coalescedFlights,
		run: func(ctx context.Context, cs []deduptype.Completion) ([]struct{}, []error) {
			return make([]struct{}, len(cs)), s.completeEach(ctx, "complete", cs)
		}}
	return s, nil
}

// maxScriptKeys bounds the keys one script call handles, so that a large
// batch does not hold the single-threaded server for long; the calls of one
// batch still go in one round trip.
const maxScriptKeys = 256

// Claim atomically creates or takes over the record for req.Key, or reports
// why it cannot. On a single node, claims made at the same time by
// concurrent callers share one script call (see coalescer), answering
// exactly as the same claims made one after another would.
func (s *Store) Claim(ctx context.Context, req dedup.ClaimRequest) (dedup.Claim, error) {
	if err := req.Key.Validate(); err != nil {
		return dedup.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return dedup.Claim{}, fmt.Errorf("redisstore: claim %s: %w", req.Key, err)
	}
	if s.sharded {
		claims, errs := s.claimFast(ctx, "claim", []dedup.ClaimRequest{req})
		return claims[0], errs[0]
	}
	return s.claims.do(ctx, req)
}

// ClaimBatch claims several distinct keys in one round trip, answering
// exactly as the same claims made one by one would. On a single node the
// claims run in request order in one script call per 256 keys; on a sharded
// client each key gets a script call of its own, pipelined per node. If any
// claim fails, the claims the batch acquired are given back before the error
// is returned.
func (s *Store) ClaimBatch(ctx context.Context, reqs []dedup.ClaimRequest) ([]dedup.Claim, error) {
	if len(reqs) == 0 {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("redisstore: claim batch: %w", err)
		}
		return []dedup.Claim{}, nil
	}
	if err := deduptype.ValidateBatch(reqs); err != nil {
		if ke := (*dedup.KeyError)(nil); errors.As(err, &ke) {
			return nil, err // it names its key and says dedup
		}
		return nil, fmt.Errorf("redisstore: claim batch: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redisstore: claim batch %s: %w", reqs[0].Key, err)
	}
	claims, errs := s.claimEach(ctx, "claim batch", reqs)
	for _, err := range errs {
		if err != nil {
			s.giveBack(ctx, claims)
			return nil, err
		}
	}
	return claims, nil
}

// claimEach claims reqs, valid keys, in order, in one round trip, and
// answers each on its own: a claim or an error. A key may be repeated: its
// later claims see what the earlier ones did.
func (s *Store) claimEach(ctx context.Context, op string, reqs []dedup.ClaimRequest) ([]dedup.Claim, []error) {
	tokens := deduptype.NewOwnerTokens(len(reqs), ' ')
	owners := make([]string, len(reqs))
	for i := range owners {
		owners[i] = tokens.At(i)
	}
	calls := s.calls(claimScript, len(reqs), 4,
		func(i int) string { return redisKey(s.prefix, reqs[i].Key) },
		func(i int, cmd []any) []any {
			return append(cmd, reqs[i].Fingerprint, reqs[i].Lease.Milliseconds(), reqs[i].TTL.Milliseconds(), owners[i])
		})
	cmds := runAs(ctx, s, claimScript, redis.NewStringSliceCmd, calls)

	claims := make([]dedup.Claim, len(reqs))
	errs := make([]error, len(reqs))
	i := 0
	for ci, cmd := range cmds {
		n := calls[ci].n
		vals, err := cmd.Result()
		r := claimReply{vals: vals, err: err}
		for j := range n {
			// Every answer is read, so that a failed batch knows all it
			// acquired.
			c, err := r.next(reqs[i+j], owners[i+j])
			claims[i+j] = c
			if err != nil {
				errs[i+j] = fmt.Errorf("redisstore: %s %s: %w", op, reqs[i+j].Key, err)
			}
		}
		if err := r.end(); err != nil && errs[i] == nil {
			errs[i] = fmt.Errorf("redisstore: %s %s: %w", op, reqs[i].Key, err)
		}
		i += n
	}
	return claims, errs
}

// giveBack releases the acquired claims of a batch that failed: the caller
// gets no owner tokens to settle them with. It is best effort; a claim not
// released is freed when its lease ends.
func (s *Store) giveBack(ctx context.Context, claims []dedup.Claim) {
	var held []dedup.Claim
	for _, c := range claims {
		if c.Status == dedup.ClaimAcquired {
			held = append(held, c)
		}
	}
	if len(held) == 0 {
		return
	}
	calls := make([]call, len(held))
	for i, c := range held {
		calls[i] = call{n: 1, cmd: []any{"evalsha", releaseScript.hash, 1, redisKey(s.prefix, c.Record.Key), c.Record.Owner, newNonce()}}
	}
	s.run(context.WithoutCancel(ctx), releaseScript, calls)
}

// call is one script invocation: the arguments of its EVALSHA, from the
// command's name on (see Store.calls).
type call struct {
	n   int   // keys
	cmd []any // "evalsha", hash, n, n keys, their arguments
}

// calls lays n keys, with argsPerKey arguments each, out in script calls of
// sc: one per key on a sharded client, up to maxScriptKeys otherwise. key
// returns the Redis key of key i, args appends the arguments of key i.
func (s *Store) calls(sc script, n, argsPerKey int, key func(i int) string, args func(i int, cmd []any) []any) []call {
	per := maxScriptKeys
	if s.sharded {
		per = 1
	}
	calls := make([]call, 0, (n+per-1)/per)
	for lo := 0; lo < n; lo += per {
		hi := min(lo+per, n)
		cmd := make([]any, 0, 3+(hi-lo)*(1+argsPerKey))
		cmd = append(cmd, "evalsha", sc.hash, hi-lo)
		for i := lo; i < hi; i++ {
			cmd = append(cmd, key(i))
		}
		for i := lo; i < hi; i++ {
			cmd = args(i, cmd)
		}
		calls = append(calls, call{n: hi - lo, cmd: cmd})
	}
	return calls
}

// run runs sc once per call, in one round trip, by EVALSHA; calls the
// server answers NOSCRIPT (its script cache was flushed or it restarted) run
// again in order by EVAL, which carries the script's text. Each command holds
// its own reply or error.
func (s *Store) run(ctx context.Context, sc script, calls []call) []*redis.Cmd {
	return runAs(ctx, s, sc, redis.NewCmd, calls)
}

// runAs is run with the replies read by commands that newCmd makes, so that
// a reply of a known shape is decoded into its type directly.
func runAs[C redis.Cmder](ctx context.Context, s *Store, sc script, newCmd func(context.Context, ...any) C, calls []call) []C {
	cmds := make([]C, len(calls))
	if len(calls) == 1 {
		cmds[0] = newCmd(ctx, calls[0].cmd...)
		_ = s.client.Process(ctx, cmds[0])
		if noScript(cmds[0].Err()) {
			cmds[0] = newCmd(ctx, sc.eval(calls[0])...)
			_ = s.client.Process(ctx, cmds[0])
		}
		s.follow(cmds[0].Err())
		return cmds
	}
	pipe := s.client.Pipeline()
	for i, c := range calls {
		cmds[i] = newCmd(ctx, c.cmd...)
		_ = pipe.Process(ctx, cmds[i])
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var again []int
	for i, cmd := range cmds {
		if noScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe = s.client.Pipeline()
		for _, i := range again {
			cmds[i] = newCmd(ctx, sc.eval(calls[i])...)
			_ = pipe.Process(ctx, cmds[i])
		}
		_, _ = pipe.Exec(ctx)
	}
	for _, cmd := range cmds {
		if s.follow(cmd.Err()) {
			break
		}
	}
	return cmds
}

// noScript reports whether err says that the server does not know a
// script.
func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// Get returns the live record for key, or an error matching
// [dedup.ErrNotFound]. Redis key expiry removes expired records, so an
// expired record is absent. Get is one script call that only reads.
func (s *Store) Get(ctx context.Context, key dedup.Key) (dedup.Record, error) {
	if err := key.Validate(); err != nil {
		return dedup.Record{}, err
	}
	if err := ctx.Err(); err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: get %s: %w", key, err)
	}
	cmds := s.run(ctx, getScript, []call{{n: 1, cmd: []any{"evalsha", getScript.hash, 1, redisKey(s.prefix, key)}}})
	vals, err := cmds[0].Slice()
	if err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: get %s: %w", key, err)
	}
	if len(vals) == len(recordFields) {
		_, hasStatus := text(vals[0])
		_, hasFingerprint := text(vals[1])
		if !hasStatus && !hasFingerprint {
			return dedup.Record{}, fmt.Errorf("%w: redisstore get %s", dedup.ErrNotFound, key)
		}
	}
	rec, err := recordOf(key, vals)
	if err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: get %s: %w", key, err)
	}
	return rec, nil
}

// Purge does nothing and returns 0: Redis deletes each record when its key
// expires (PEXPIREAT at the record's expiry), and reads treat it as absent
// from that moment.
func (s *Store) Purge(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("redisstore: purge: %w", err)
	}
	return 0, nil
}

// newNonce returns a token for one settling write; it only has to differ
// from the other settling writes of the same owner. The server compares it
// as the decimal text go-redis sends.
func newNonce() uint64 {
	return rand.Uint64()
}

// refused turns a script's 0 into ErrLeaseLost.
func refused(op string, key dedup.Key, ok int64, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("redisstore: %s %s: %w", op, key, err)
	case ok != 1:
		return fmt.Errorf("%w: redisstore %s %s", dedup.ErrLeaseLost, op, key)
	}
	return nil
}
