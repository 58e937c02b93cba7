package dedup

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// batchMode is how the batch statements that join their keys to the table
// are sent: as unnamed statements, which PostgreSQL plans for the parameters
// at hand, keeping only their description cached. A prepared statement
// would, after five runs, be given a generic plan made once for every batch
// size and kept while the table grows: one made on a near-empty table scans
// the whole table for each key of a later batch.
const batchMode = pgx.QueryExecModeCacheDescribe

// claimMode is how the batch claims are sent: as prepared statements, which
// skip parsing and planning after the first runs (most of a small batch's
// server time). Their plan has no choice to get wrong: one insert per key,
// through the primary key that arbitrates the conflict.
const claimMode = pgx.QueryExecModeCacheStatement

// pgListSep separates the items of a list parameter. Keys cannot contain it
// (they have no control characters) and owner tokens are hex.
const pgListSep = '\x1f'

// pgSplit is the SQL that turns list parameter p into a text array.
func pgSplit(p string) string { return `string_to_array(` + p + `, E'\x1f')` }

// pgList builds a list parameter: the items of a column joined by
// pgListSep. A batch statement takes its columns as lists rather than as
// arrays because pgx boxes every element of an array parameter, an
// allocation per item and column.
type pgList []byte

func (l *pgList) add(s string) {
	if len(*l) > 0 {
		*l = append(*l, pgListSep)
	}
	*l = append(*l, s...)
}

// pgLists returns k empty lists, each with room for n items of up to size
// bytes, so that filling them does not grow them again and again.
func pgLists(k, n, size int) []pgList {
	buf := make([]byte, 0, k*n*(size+1))
	lists := make([]pgList, k)
	for i := range lists {
		lists[i] = pgList(buf[i*n*(size+1) : i*n*(size+1) : (i+1)*n*(size+1)])
	}
	return lists
}

// addMicros adds d in whole microseconds, PostgreSQL's resolution. A
// duration list is never empty, so an item of "0" cannot be mistaken for an
// empty list.
func (l *pgList) addMicros(d time.Duration) {
	if len(*l) > 0 {
		*l = append(*l, pgListSep)
	}
	*l = strconv.AppendInt(*l, d.Microseconds(), 10)
}

// addTID adds the ctid a locator packs, as PostgreSQL writes one.
func (l *pgList) addTID(locator uint64) {
	if len(*l) > 0 {
		*l = append(*l, pgListSep)
	}
	*l = append(*l, '(')
	*l = strconv.AppendUint(*l, locator>>16, 10)
	*l = append(*l, ',')
	*l = strconv.AppendUint(*l, locator&0xffff, 10)
	*l = append(*l, ')')
}

// maxMicrosLen is the longest a duration in microseconds can be written.
const maxMicrosLen = len("-9223372036854775")

// listable reports whether s can be an item of a list: an empty item alone
// would read as an empty list.
func listable(s string) bool { return s != "" && strings.IndexByte(s, pgListSep) < 0 }

// ClaimBatch claims several distinct keys with one upsert round trip for
// all of them and one read for those it could not acquire.
func (s *PostgresStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error) {
	if err := deduptype.ValidateBatch(reqs); err != nil {
		return nil, fmt.Errorf("dedup: postgres claim batch: %w", err)
	}
	b := newPostgresBatch(s.pool, s.sql.claimBatch, StatusProcessing, reqs)
	if err := s.claimWaves(ctx, b); err != nil {
		s.giveBack(ctx, b)
		return nil, s.opError("claim batch", err)
	}
	return b.claims, nil
}

// claimBatchInTx claims distinct keys inside tx for a batch of the
// transactional inbox: the rows it acquires are written as succeeded, and
// commit or vanish with tx, whose row locks are their lease.
func (s *PostgresStore) claimBatchInTx(ctx context.Context, tx pgx.Tx, reqs []ClaimRequest) ([]Claim, error) {
	if err := deduptype.ValidateBatch(reqs); err != nil {
		return nil, fmt.Errorf("dedup: postgres claim batch in tx: %w", err)
	}
	b := newPostgresBatch(tx, s.sql.claimBatchInTx, StatusSucceeded, reqs)
	if err := s.claimWaves(ctx, b); err != nil {
		return nil, s.opError("claim batch in tx", err)
	}
	return b.claims, nil
}

func newPostgresBatch(q pgBatchQuerier, upsert string, status Status, reqs []ClaimRequest) *postgresBatch {
	b := &postgresBatch{q: q, upsert: upsert, status: status, reqs: reqs,
		claims: make([]Claim, len(reqs)), pending: make([]int, len(reqs))}
	for i := range b.pending {
		b.pending[i] = i
	}
	return b
}

// claimWaves claims the batch's keys. A key refused, then purged before it
// was read, is claimed again in a second wave.
func (s *PostgresStore) claimWaves(ctx context.Context, b *postgresBatch) error {
	for len(b.pending) > 0 {
		wave := b.pending
		b.pending = nil
		if err := s.runWave(ctx, b, wave); err != nil {
			return err
		}
	}
	return nil
}

// pgBatchQuerier runs the batch statements: a pool or a transaction.
type pgBatchQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// postgresBatch is the progress of one ClaimBatch.
type postgresBatch struct {
	q       pgBatchQuerier // the pool, or the inbox's transaction
	upsert  string         // the claim statement
	status  Status         // what it writes
	reqs    []ClaimRequest
	claims  []Claim
	pending []int // request indexes still unanswered, ascending
	retried map[int]bool
	// sent are the keys and owner tokens of every claim sent so far.
	sent []keyOwner
}

type keyOwner struct {
	key   Key
	owner string
}

// giveBack releases whatever a failed ClaimBatch acquired, by the owner
// tokens it sent (a failure can come before the acquired rows are read):
// the caller gets no token to settle them with, so kept they would hold
// their keys until the lease ran out and count an attempt that never ran.
// It is best effort: the leases free them otherwise.
func (s *PostgresStore) giveBack(ctx context.Context, b *postgresBatch) {
	if len(b.sent) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	var batch pgx.Batch
	for _, ko := range b.sent {
		batch.Queue(s.sql.release, ko.key.Scope, ko.key.EventID, ko.owner)
	}
	_ = s.pool.SendBatch(ctx, &batch).Close()
}

// keyOrder is the order in which batch statements lock rows, the same for
// claims and completions so that concurrent batches cannot deadlock.
func keyOrder(a, b Key) int {
	return cmp.Or(strings.Compare(a.Scope, b.Scope), strings.Compare(a.EventID, b.EventID))
}

// runWave claims the wave's keys in one statement and reads the
// records of those it could not acquire in a second one.
func (s *PostgresStore) runWave(ctx context.Context, b *postgresBatch, wave []int) error {
	slices.SortFunc(wave, func(i, j int) int { return keyOrder(b.reqs[i].Key, b.reqs[j].Key) })
	n := len(wave)
	keyLen, fpLen, fpsListable := 0, 0, true
	for _, i := range wave {
		req := &b.reqs[i]
		keyLen = max(keyLen, len(req.Key.Scope), len(req.Key.EventID))
		fpLen = max(fpLen, len(req.Fingerprint))
		fpsListable = fpsListable && listable(req.Fingerprint)
	}
	keys, micros := pgLists(2, n, keyLen), pgLists(2, n, maxMicrosLen)
	scopes, ids, leases, expiries := keys[0], keys[1], micros[0], micros[1]
	var fps pgList
	var fpArray []string // the fingerprints, when one of them cannot be a list item
	if fpsListable {
		fps = pgLists(1, n, fpLen)[0]
	} else {
		fpArray = make([]string, 0, n)
	}
	tokens := deduptype.NewOwnerTokens(n, pgListSep) // a list of n tokens
	byOwner := make(map[string]int, n)               // owner token -> position in wave
	for w, i := range wave {
		req := &b.reqs[i]
		scopes.add(req.Key.Scope)
		ids.add(req.Key.EventID)
		if fpArray != nil {
			fpArray = append(fpArray, req.Fingerprint)
		} else {
			fps.add(req.Fingerprint)
		}
		leases.addMicros(req.Lease)
		expiries.addMicros(expiryOf(req.TTL))
		byOwner[tokens.At(w)] = w
		b.sent = append(b.sent, keyOwner{req.Key, tokens.At(w)})
	}
	rows, err := b.q.Query(ctx, b.upsert, claimMode, []byte(scopes), []byte(ids), fpArray, nullable(fps), string(tokens),
		[]byte(leases), []byte(expiries))
	if err != nil {
		return err
	}
	done := make([]bool, n)
	var (
		owner    pgtype.DriverBytes
		tid      pgtype.TID
		at       time.Time
		previous pgtype.Text
		r        pgRecord
	)
	_, err = pgx.ForEachRow(rows, []any{&owner, &tid, &at, &previous, &r.attempts, &r.leaseUntil, &r.createdAt,
		&r.updatedAt, &r.expiresAt, &r.lastError, &r.firstFailure, &r.lastFailure, &r.result}, func() error {
		w, ok := byOwner[string(owner)]
		if !ok || done[w] {
			return fmt.Errorf("%w: unexpected row for owner %q", ErrMalformedRecord, owner)
		}
		done[w] = true
		i := wave[w]
		req := &b.reqs[i]
		// The row is the claim's own: what it did not return, it wrote.
		r.status = pgtype.Text{String: string(b.status), Valid: true}
		r.fingerprint = pgtype.Text{String: req.Fingerprint, Valid: true}
		r.owner = pgtype.Text{String: tokens.At(w), Valid: true}
		c, err := acquired(req.Key, &r, previous)
		if err != nil {
			return fmt.Errorf("%s: %w", req.Key, err)
		}
		c.Locator = tidLocator(tid)
		b.claims[i] = c
		r, previous = pgRecord{}, pgtype.Text{}
		return nil
	})
	if err != nil {
		return scanError(err)
	}

	var refused []int // positions in wave
	scopes, ids = scopes[:0], ids[:0]
	for w, ok := range done {
		if !ok {
			refused = append(refused, w)
			scopes.add(b.reqs[wave[w]].Key.Scope)
			ids.add(b.reqs[wave[w]].Key.EventID)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	rows, err = b.q.Query(ctx, s.sql.readBatch, batchMode, []byte(scopes), []byte(ids))
	if err != nil {
		return err
	}
	read := make([]bool, len(refused))
	var pos int64
	r = pgRecord{}
	_, err = pgx.ForEachRow(rows, r.targets(&pos, &at), func() error {
		if pos < 1 || pos > int64(len(refused)) || read[pos-1] {
			return fmt.Errorf("%w: read answered position %d of %d", ErrMalformedRecord, pos, len(refused))
		}
		read[pos-1] = true
		i := wave[refused[pos-1]]
		req := &b.reqs[i]
		rec, err := r.decode(req.Key)
		if err != nil {
			return fmt.Errorf("%s: %w", req.Key, err)
		}
		b.claims[i] = Claim{Status: deduptype.Classify(rec, req.Fingerprint), Record: rec}
		r = pgRecord{}
		return nil
	})
	if err != nil {
		return scanError(err)
	}
	// What is left refused the claim and was purged before the read: claim
	// it again in the next wave, once.
	for k, ok := range read {
		if ok {
			continue
		}
		i := wave[refused[k]]
		if b.retried[i] {
			return fmt.Errorf("%s: record refused the claim, then vanished twice (concurrent purge)", b.reqs[i].Key)
		}
		if b.retried == nil {
			b.retried = make(map[int]bool)
		}
		b.retried[i] = true
		b.pending = append(b.pending, i)
	}
	slices.Sort(b.pending)
	return nil
}

// nullable returns l, or nil (SQL NULL) when it is empty.
func nullable(l pgList) []byte {
	if len(l) == 0 {
		return nil
	}
	return l
}

// CompleteBatch completes the records their owners still hold: those a
// wrapper claimed with ClaimBatch by where the claim wrote them, the rest
// by key, one statement each.
func (s *PostgresStore) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	if err := deduptype.ValidateCompletions(cs); err != nil {
		return nil, fmt.Errorf("dedup: postgres complete batch: %w", err)
	}
	done := make([]bool, len(cs))
	if err := s.completeLocated(ctx, cs, done); err != nil {
		return nil, s.opError(fmt.Sprintf("complete batch of %d", len(cs)), err)
	}
	if err := s.completeByKey(ctx, cs, done); err != nil {
		return nil, s.opError(fmt.Sprintf("complete batch of %d", len(cs)), err)
	}
	errs := make([]error, len(cs))
	for i, ok := range done {
		if !ok {
			errs[i] = fmt.Errorf("dedup: postgres complete %s: %w", cs[i].Key, ErrLeaseLost)
		}
	}
	return errs, nil
}

// tidLocator packs a row's ctid into a locator, which is never 0: a
// tuple's offset starts at 1.
func tidLocator(tid pgtype.TID) uint64 {
	if !tid.Valid {
		return 0
	}
	return uint64(tid.BlockNumber)<<16 | uint64(tid.OffsetNumber)
}

// completeLocated completes, by their locators, the completions that have
// one, no result, and the first such one's TTL, marking those it wrote.
func (s *PostgresStore) completeLocated(ctx context.Context, cs []deduptype.Completion, done []bool) error {
	var ttl time.Duration
	byOwner := make(map[string]int)
	var tids, owners pgList
	for i := range cs {
		c := &cs[i]
		if c.Locator == 0 || c.Result != nil || !listable(c.Owner) || (len(byOwner) > 0 && c.TTL != ttl) {
			continue
		}
		if _, dup := byOwner[c.Owner]; dup {
			continue
		}
		if len(byOwner) == 0 {
			ttl = c.TTL
			tids = pgLists(1, len(cs), len("(4294967295,65535)"))[0]
			owners = pgLists(1, len(cs), len(c.Owner))[0]
		}
		byOwner[c.Owner] = i
		tids.addTID(c.Locator)
		owners.add(c.Owner)
	}
	if len(byOwner) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, s.sql.completeLocated, batchMode, []byte(tids), ttl, expiryOf(ttl), []byte(owners))
	if err != nil {
		return err
	}
	var owner pgtype.DriverBytes
	_, err = pgx.ForEachRow(rows, []any{&owner}, func() error {
		i, ok := byOwner[string(owner)]
		if !ok {
			return fmt.Errorf("%w: complete batch answered owner %q", ErrMalformedRecord, owner)
		}
		done[i] = true
		return nil
	})
	return err
}

// completeByKey completes the completions not done yet, looking each key
// up in the primary key.
func (s *PostgresStore) completeByKey(ctx context.Context, cs []deduptype.Completion, done []bool) error {
	// Rows are locked in key order, as claims lock them, so that batches
	// cannot deadlock. An owner that cannot be a list item is no token of
	// this store: it holds nothing.
	order := make([]int, 0, len(cs))
	withResults := false
	keyLen := 0
	for i := range cs {
		if !done[i] && listable(cs[i].Owner) {
			order = append(order, i)
			withResults = withResults || cs[i].Result != nil
			keyLen = max(keyLen, len(cs[i].Key.Scope), len(cs[i].Key.EventID))
		}
	}
	if len(order) == 0 {
		return nil
	}
	slices.SortFunc(order, func(i, j int) int { return keyOrder(cs[i].Key, cs[j].Key) })
	keys, micros := pgLists(2, len(order), keyLen), pgLists(2, len(order), maxMicrosLen)
	scopes, ids, ttls, expiries := keys[0], keys[1], micros[0], micros[1]
	owners := pgLists(1, len(order), 32)[0]
	var results [][]byte // nil: all NULL
	if withResults {
		results = make([][]byte, len(order))
	}
	for k, i := range order {
		c := &cs[i]
		scopes.add(c.Key.Scope)
		ids.add(c.Key.EventID)
		owners.add(c.Owner)
		ttls.addMicros(c.TTL)
		expiries.addMicros(expiryOf(c.TTL))
		if withResults {
			results[k] = c.Result
		}
	}
	rows, err := s.pool.Query(ctx, s.sql.completeBatch, batchMode, []byte(scopes), []byte(ids), []byte(owners), results,
		[]byte(ttls), []byte(expiries))
	if err != nil {
		return err
	}
	var pos int64
	_, err = pgx.ForEachRow(rows, []any{&pos}, func() error {
		if pos < 1 || pos > int64(len(order)) {
			return fmt.Errorf("%w: complete batch answered position %d of %d", ErrMalformedRecord, pos, len(order))
		}
		done[order[pos-1]] = true
		return nil
	})
	return err
}
