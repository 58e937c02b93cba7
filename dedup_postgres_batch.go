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

// addPacked adds pgPack(s, n).
func (l *pgList) addPacked(s string, n int) {
	if len(*l) > 0 {
		*l = append(*l, pgListSep)
	}
	*l = appendPacked(*l, s, n)
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

// ClaimBatch claims several distinct keys: one insert for the keys no row
// holds, and for the others one read and, where the rule lets a claim take
// a row over, one takeover.
func (s *PostgresStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error) {
	if err := deduptype.ValidateBatch(reqs); err != nil {
		return nil, fmt.Errorf("dedup: postgres claim batch: %w", err)
	}
	b := newPostgresBatch(s.pool, nil, s.sql.claimBatch, s.sql.takeoverBatch, StatusProcessing, reqs)
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
	b := newPostgresBatch(tx, tx, s.sql.claimBatchInTx, s.sql.takeoverBatchInTx, StatusSucceeded, reqs)
	if err := s.claimWaves(ctx, b); err != nil {
		return nil, s.opError("claim batch in tx", err)
	}
	return b.claims, nil
}

func newPostgresBatch(q pgBatchQuerier, tx pgx.Tx, insert, takeover string, status Status, reqs []ClaimRequest) *postgresBatch {
	b := &postgresBatch{q: q, tx: tx, insert: insert, takeover: takeover, status: status, reqs: reqs,
		claims: make([]Claim, len(reqs)), pending: make([]int, len(reqs))}
	for i := range b.pending {
		b.pending[i] = i
	}
	return b
}

// maxWaves bounds how often one key of a batch is tried: a takeover is
// refused only when another claim changed the row since it was read, which
// the next read then sees.
const maxWaves = 4

// claimWaves claims the batch's keys. A key a takeover was refused is read
// and claimed again in the next wave.
func (s *PostgresStore) claimWaves(ctx context.Context, b *postgresBatch) error {
	if len(b.reqs) > 0 && s.layout.Load() != layoutV2 {
		// Pulled in key order, as claimed: concurrent pulls lock v1 rows
		// in one order.
		inOrder := slices.Clone(b.pending)
		slices.SortFunc(inOrder, func(i, j int) int { return keyOrder(b.reqs[i].Key, b.reqs[j].Key) })
		scopes, ids := keyLists(b.reqs, inOrder)
		if err := s.pull(ctx, b.tx, scopes, ids); err != nil {
			return err
		}
	}
	for wave := 1; len(b.pending) > 0; wave++ {
		if wave > maxWaves {
			return fmt.Errorf("%s: claimed %d times, the row changing each time", b.reqs[b.pending[0]].Key, maxWaves)
		}
		keys := b.pending
		b.pending = nil
		if err := s.runWave(ctx, b, keys); err != nil {
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
	q                pgBatchQuerier // the pool, or the inbox's transaction
	tx               pgx.Tx         // the inbox's transaction, or nil
	insert, takeover string         // the claim statements
	status           Status         // what they write
	reqs             []ClaimRequest
	claims           []Claim
	pending          []int    // request indexes still unanswered, ascending
	owners           []string // by request index, the token of its latest claim
	// sent are the keys and owner tokens of every claim sent so far.
	sent []keyOwner
}

// owner is the token of request i's latest claim.
func (b *postgresBatch) owner(i int) string { return b.owners[i] }

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
		batch.Queue(s.sql.release, ko.key.Scope, ko.key.EventID, pgPack(ko.owner, ownerBytes))
	}
	_ = s.pool.SendBatch(ctx, &batch).Close()
}

// keyOrder is the order in which batch statements lock rows, the same for
// claims and completions so that concurrent batches cannot deadlock.
func keyOrder(a, b Key) int {
	return cmp.Or(strings.Compare(a.Scope, b.Scope), strings.Compare(a.EventID, b.EventID))
}

// keyLists returns the scopes and event IDs of the requests at positions
// (in key order) as lists.
func keyLists(reqs []ClaimRequest, positions []int) (scopes, ids pgList) {
	keyLen := 0
	for _, i := range positions {
		keyLen = max(keyLen, len(reqs[i].Key.Scope), len(reqs[i].Key.EventID))
	}
	keys := pgLists(2, len(positions), keyLen)
	for _, i := range positions {
		keys[0].add(reqs[i].Key.Scope)
		keys[1].add(reqs[i].Key.EventID)
	}
	return keys[0], keys[1]
}

// claimArgs are the arguments of a claim statement (batchRows) for the
// requests at positions, with their owner tokens; for the inbox's insert
// (inbox set), only those it writes.
func claimArgs(reqs []ClaimRequest, positions []int, owner func(int) string, inbox bool) []any {
	n := len(positions)
	fpLen, fpsListable := 0, true
	for _, i := range positions {
		fpLen = max(fpLen, len(reqs[i].Fingerprint))
		fpsListable = fpsListable && listable(reqs[i].Fingerprint)
	}
	scopes, ids := keyLists(reqs, positions)
	micros := pgLists(2, n, maxMicrosLen)
	leases, expiries := micros[0], micros[1]
	var owners pgList
	if !inbox {
		owners = pgLists(1, n, 2*ownerBytes)[0]
	}
	var fps pgList
	var fpArray []string // the fingerprints, when one of them cannot be a list item
	if fpsListable {
		fps = pgLists(1, n, max(fpLen, 2*fingerprintBytes))[0]
	} else {
		fpArray = make([]string, 0, n)
	}
	for _, i := range positions {
		req := &reqs[i]
		if fpArray != nil {
			fpArray = append(fpArray, pgPack(req.Fingerprint, fingerprintBytes))
		} else {
			fps.addPacked(req.Fingerprint, fingerprintBytes)
		}
		expiries.addMicros(expiryOf(req.TTL))
		if !inbox {
			owners.addPacked(owner(i), ownerBytes)
			leases.addMicros(req.Lease)
		}
	}
	if inbox {
		return []any{claimMode, []byte(scopes), []byte(ids), fpArray, nullable(fps), []byte(expiries)}
	}
	return []any{claimMode, []byte(scopes), []byte(ids), fpArray, nullable(fps), []byte(owners), []byte(leases), []byte(expiries)}
}

// compareKey compares key with the key of a row, given as its scope and
// event ID's bytes, in keyOrder.
func compareKey(key Key, scope, id []byte) int {
	return cmp.Or(compareBytes(key.Scope, scope), compareBytes(key.EventID, id))
}

func compareBytes(s string, b []byte) int {
	for i := range min(len(s), len(b)) {
		if s[i] != b[i] {
			return cmp.Compare(s[i], b[i])
		}
	}
	return cmp.Compare(len(s), len(b))
}

// runWave claims the wave's keys (request indexes) in key order: the
// insert acquires those no row holds, the read answers the others, and the
// takeover acquires those whose rows the rule lets go. A key the takeover
// was refused is pending for the next wave.
func (s *PostgresStore) runWave(ctx context.Context, b *postgresBatch, wave []int) error {
	slices.SortFunc(wave, func(i, j int) int { return keyOrder(b.reqs[i].Key, b.reqs[j].Key) })
	tokens := deduptype.NewOwnerTokens(len(wave), pgListSep)
	if b.owners == nil {
		b.owners = make([]string, len(b.reqs))
	}
	for w, i := range wave {
		b.owners[i] = tokens.At(w)
		b.sent = append(b.sent, keyOwner{b.reqs[i].Key, b.owners[i]})
	}
	token := b.owner
	done, err := s.insertWave(ctx, b, wave, token)
	if err != nil {
		return err
	}
	refused := make([]int, 0, len(wave)-done.count)
	for w, i := range wave {
		if !done.at[w] {
			refused = append(refused, i)
		}
	}
	if len(refused) == 0 {
		return nil
	}
	takeover, err := s.readWave(ctx, b, refused)
	if err != nil || len(takeover) == 0 {
		return err
	}
	done, err = s.takeoverWave(ctx, b, takeover, token)
	if err != nil {
		return err
	}
	for k, i := range takeover {
		if !done.at[k] {
			b.pending = append(b.pending, i)
		}
	}
	slices.Sort(b.pending)
	return nil
}

// waveDone marks the keys of a wave a statement acquired, by position.
type waveDone struct {
	at    []bool
	count int
}

// markRow marks the key a row returned, given as its scope and event ID's
// bytes, among the requests at positions (in key order), and returns its
// request index.
func (d *waveDone) markRow(reqs []ClaimRequest, positions []int, scope, id []byte) (int, error) {
	k, ok := slices.BinarySearchFunc(positions, 0, func(i, _ int) int { return compareKey(reqs[i].Key, scope, id) })
	switch {
	case !ok:
		return 0, fmt.Errorf("%w: unexpected row for key %q/%q", ErrMalformedRecord, scope, id)
	case d.at[k]:
		return 0, fmt.Errorf("%w: a key answered twice", ErrMalformedRecord)
	}
	d.at[k] = true
	d.count++
	return positions[k], nil
}

// insertWave inserts the rows of the keys at wave that no row holds; their
// claims are what the batch wrote, with the place (locator) the insert
// returns.
func (s *PostgresStore) insertWave(ctx context.Context, b *postgresBatch, wave []int, owner func(int) string) (waveDone, error) {
	done := waveDone{at: make([]bool, len(wave))}
	inbox := b.status == StatusSucceeded
	rows, err := b.q.Query(ctx, b.insert, claimArgs(b.reqs, wave, owner, inbox)...)
	if err != nil {
		return done, err
	}
	var (
		scope, id pgtype.DriverBytes
		tid       pgtype.TID
		at        time.Time
		expires   time.Time
	)
	targets := []any{&scope, &id, &tid, &at, &expires}
	if inbox {
		targets = []any{&scope, &id, &expires}
	}
	_, err = pgx.ForEachRow(rows, targets, func() error {
		i, err := done.markRow(b.reqs, wave, scope, id)
		if err != nil {
			return err
		}
		req := &b.reqs[i]
		rec := Record{Key: req.Key, Status: b.status, Fingerprint: req.Fingerprint, Attempts: 1, ExpiresAt: expires,
			Owner: owner(i)}
		if !inbox { // an inbox row has no lease and no times
			rec.LeaseUntil = at.Add(req.Lease.Truncate(time.Microsecond))
			rec.CreatedAt, rec.UpdatedAt = at, at
		}
		b.claims[i] = Claim{Status: ClaimAcquired, Record: rec, Locator: tidLocator(tid)}
		return nil
	})
	return done, scanError(err)
}

// readWave reads the rows that refused the keys at refused (in key order),
// answers those the rule keeps, and returns those a claim may take over,
// in key order: expired, failed for a retry, or in progress past their
// lease, and those purged since they refused.
func (s *PostgresStore) readWave(ctx context.Context, b *postgresBatch, refused []int) ([]int, error) {
	scopes, ids := keyLists(b.reqs, refused)
	rows, err := b.q.Query(ctx, s.sql.readBatch, batchMode, []byte(scopes), []byte(ids))
	if err != nil {
		return nil, err
	}
	read := make([]bool, len(refused))
	takeover := make([]bool, len(refused))
	var (
		pos int64
		now time.Time
		r   pgRecord
	)
	_, err = pgx.ForEachRow(rows, r.targets(&pos, &now), func() error {
		if pos < 1 || pos > int64(len(refused)) || read[pos-1] {
			return fmt.Errorf("%w: read answered position %d of %d", ErrMalformedRecord, pos, len(refused))
		}
		read[pos-1] = true
		i := refused[pos-1]
		req := &b.reqs[i]
		rec, err := r.decode(req.Key)
		if err != nil {
			return fmt.Errorf("%s: %w", req.Key, err)
		}
		r = pgRecord{}
		if !now.Before(rec.ExpiresAt) || deduptype.MayTakeOver(rec, req.Fingerprint, now) {
			takeover[pos-1] = true
			return nil
		}
		b.claims[i] = Claim{Status: deduptype.Classify(rec, req.Fingerprint), Record: rec}
		return nil
	})
	if err != nil {
		return nil, scanError(err)
	}
	var out []int
	for k, i := range refused {
		if takeover[k] || !read[k] {
			out = append(out, i)
		}
	}
	return out, nil
}

// takeoverWave takes over the rows of the keys at positions (in key order)
// where the rule still lets it.
func (s *PostgresStore) takeoverWave(ctx context.Context, b *postgresBatch, positions []int, owner func(int) string) (waveDone, error) {
	done := waveDone{at: make([]bool, len(positions))}
	rows, err := b.q.Query(ctx, b.takeover, claimArgs(b.reqs, positions, owner, false)...)
	if err != nil {
		return done, err
	}
	var (
		scope, id pgtype.DriverBytes
		tid       pgtype.TID
		at        time.Time
		previous  pgtype.Int2
		r         pgRecord
	)
	_, err = pgx.ForEachRow(rows, r.targets(&scope, &id, &tid, &at, &previous), func() error {
		i, err := done.markRow(b.reqs, positions, scope, id)
		if err != nil {
			return err
		}
		c, err := acquired(b.reqs[i].Key, &r, previous)
		if err != nil {
			return fmt.Errorf("%s: %w", b.reqs[i].Key, err)
		}
		if b.status == StatusSucceeded { // the inbox's row holds no token
			c.Record.Owner = owner(i)
		}
		c.Locator = tidLocator(tid)
		b.claims[i] = c
		r, previous = pgRecord{}, pgtype.Int2{}
		return nil
	})
	return done, scanError(err)
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
			owners = pgLists(1, len(cs), 2*ownerBytes)[0]
		}
		byOwner[pgPack(c.Owner, ownerBytes)] = i
		tids.addTID(c.Locator)
		owners.addPacked(c.Owner, ownerBytes)
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
		owners.addPacked(c.Owner, ownerBytes)
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
