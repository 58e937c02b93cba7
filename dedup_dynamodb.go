package dedup

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/dedupkit/dedup/deduptype"
)

// Attribute names of a DynamoDB record item.
const (
	ddbPK           = "pk"
	ddbScope        = "scope"
	ddbEventID      = "event_id"
	ddbStatus       = "status"
	ddbFingerprint  = "fp"
	ddbAttempts     = "attempts"
	ddbOwner        = "owner"
	ddbLeaseUntil   = "lease_until_ms"
	ddbCreated      = "created_ms"
	ddbUpdated      = "updated_ms"
	ddbExpiresMs    = "expires_ms"
	ddbExpiresAt    = "expires_at"
	ddbLastError    = "last_error"
	ddbFirstFailure = "first_failure_ms"
	ddbLastFailure  = "last_failure_ms"
	ddbResult       = "result"
)

// ddbConcurrency bounds the requests ClaimBatch and Purge have in flight.
const ddbConcurrency = 16

// DynamoDBStore is a [Store] keeping one DynamoDB item per key in a table made
// by [CreateDynamoDBTable].
//
// Claims are conditional writes; Complete, Fail, Extend and Release are
// conditional on the owner token. ClaimBatch and CompleteBatch send the same
// conditions as PartiQL statements, 25 to a request (IAM's
// dynamodb:PartiQLInsert and dynamodb:PartiQLUpdate; without them, one
// request per record). Expiry is kept twice: expires_ms, exact,
// which every read and condition uses, so an expired item counts as absent
// even before DynamoDB deletes it; and expires_at, in the whole epoch seconds
// DynamoDB's native TTL reads, rounded up so TTL never deletes early.
//
// DynamoDB has no clock that conditions can read, so leases and expiry are
// judged by the clock of the process calling the store. Two processes whose
// clocks differ by d disagree by d on when a lease ends: one running ahead
// takes over a lease d early, while its owner may still be working. Keep
// clocks synchronised (NTP keeps them within tens of milliseconds) and leases
// far longer than the worst skew: a margin of one second against leases of
// ten seconds or more is safe.
type DynamoDBStore struct {
	client *dynamodb.Client
	table  string
	sql    ddbStatements
	// perItem is set once IAM refused a PartiQL statement: the batches then
	// go one request per record (PutItem and UpdateItem).
	perItem atomic.Bool
}

// ddbStatements are the PartiQL statements of a store's table: a fresh
// record's insert, which PartiQL refuses where the key has an item, and a
// completion's update, which sets the status, the update and expiry times
// and, with a result, the result, conditioned on the owner's live claim.
type ddbStatements struct {
	insert, completeResult, completeNoResult string
}

// ddbFreshAttrs are the attributes of a fresh record's item (encodeRecord),
// in the order of the insert's parameters.
var ddbFreshAttrs = []string{ddbPK, ddbScope, ddbEventID, ddbStatus, ddbFingerprint, ddbAttempts, ddbOwner,
	ddbLeaseUntil, ddbCreated, ddbUpdated, ddbExpiresMs, ddbExpiresAt}

func newDDBStatements(table string) ddbStatements {
	set := `UPDATE "` + table + `" SET "` + ddbStatus + `" = ? SET "` + ddbUpdated + `" = ? SET "` + ddbExpiresMs +
		`" = ? SET "` + ddbExpiresAt + `" = ?`
	where := ` WHERE "` + ddbPK + `" = ? AND "` + ddbOwner + `" = ? AND "` + ddbStatus + `" = ? AND "` + ddbExpiresMs + `" > ?`
	value := make([]string, len(ddbFreshAttrs))
	for i, a := range ddbFreshAttrs {
		value[i] = "'" + a + "': ?"
	}
	return ddbStatements{
		insert:           `INSERT INTO "` + table + `" VALUE {` + strings.Join(value, ", ") + `}`,
		completeResult:   set + ` SET "` + ddbResult + `" = ?` + where,
		completeNoResult: set + ` REMOVE "` + ddbResult + `"` + where,
	}
}

var (
	_ Store                    = (*DynamoDBStore)(nil)
	_ deduptype.BatchCompleter = (*DynamoDBStore)(nil)
)

// NewDynamoDBStore returns a store on the table [WithTable] names, else
// [DefaultTable], which must already exist (see [CreateDynamoDBTable]).
func NewDynamoDBStore(client *dynamodb.Client, opts ...StoreOpt) (*DynamoDBStore, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: dynamodb store: nil client", ErrConfig)
	}
	if err := storeOptions(opts).refusePostgresOnly("NewDynamoDBStore"); err != nil {
		return nil, err
	}
	table := storeTable(opts)
	if err := validateDynamoDBTable(table); err != nil {
		return nil, err
	}
	return &DynamoDBStore{client: client, table: table, sql: newDDBStatements(table)}, nil
}

// CreateDynamoDBTable creates the table a [DynamoDBStore] needs, the one
// [WithTable] names or else [DefaultTable], with on-demand billing and TTL on
// expires_at, and waits until it is active. It succeeds when the table
// already exists.
func CreateDynamoDBTable(ctx context.Context, client *dynamodb.Client, opts ...StoreOpt) error {
	if client == nil {
		return fmt.Errorf("%w: dynamodb create table: nil client", ErrConfig)
	}
	table := storeTable(opts)
	if err := validateDynamoDBTable(table); err != nil {
		return err
	}
	_, err := client.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(ddbPK), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(ddbPK), KeyType: types.KeyTypeHash}},
	})
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("dedup: dynamodb create table %s: %w", table, err)
	}
	waiter := dynamodb.NewTableExistsWaiter(client, func(o *dynamodb.TableExistsWaiterOptions) {
		o.MinDelay, o.MaxDelay = time.Second, 5*time.Second
	})
	if err := waiter.Wait(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}, 5*time.Minute); err != nil {
		return fmt.Errorf("dedup: dynamodb create table %s: waiting for it to be active: %w", table, err)
	}
	ttl, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
	if err != nil {
		return fmt.Errorf("dedup: dynamodb create table %s: %w", table, err)
	}
	if d := ttl.TimeToLiveDescription; d != nil && aws.ToString(d.AttributeName) == ddbExpiresAt &&
		(d.TimeToLiveStatus == types.TimeToLiveStatusEnabled || d.TimeToLiveStatus == types.TimeToLiveStatusEnabling) {
		return nil
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName:               aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(ddbExpiresAt), Enabled: aws.Bool(true)},
	})
	if err != nil {
		return fmt.Errorf("dedup: dynamodb create table %s: enabling TTL: %w", table, err)
	}
	return nil
}

// validateDynamoDBTable applies DynamoDB's table naming rules.
func validateDynamoDBTable(table string) error {
	if len(table) < 3 || len(table) > 255 {
		return fmt.Errorf("%w: dynamodb table name %q: must be 3 to 255 characters", ErrConfig, table)
	}
	for _, c := range table {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("%w: dynamodb table name %q: only a-z, A-Z, 0-9, '_', '.' and '-' are allowed", ErrConfig, table)
		}
	}
	return nil
}

// Claim creates the item for req.Key, or takes it over, with conditional
// writes; a refused write returns the blocking item, which decides the answer.
//
// Creating (key absent or expired) and taking over (attempts+1, history kept)
// are two different writes, because an update expression cannot branch on
// the item's expiry to reset attempts. The common cases, a new key and a
// duplicate, take one round trip; a takeover takes two: the refused create
// reveals the item, then an update conditioned on the takeover rule applies.
// Every write re-checks its whole rule in its condition, so a concurrent
// claimant can never make both succeed.
func (s *DynamoDBStore) Claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	if err := req.Key.Validate(); err != nil {
		return Claim{}, err
	}
	c, err := s.claim(ctx, req)
	if err != nil {
		return Claim{}, fmt.Errorf("dedup: dynamodb claim %s: %w", req.Key, err)
	}
	return c, nil
}

// claimRounds bounds how often a claim retries after the item it was refused
// by vanished (expired or deleted) before it could act on it.
const claimRounds = 4

func (s *DynamoDBStore) claim(ctx context.Context, req ClaimRequest) (Claim, error) {
	for range claimRounds {
		now := time.Now().UnixMilli()
		won, blocking, err := s.create(ctx, req, now)
		switch {
		case err != nil:
			return Claim{}, err
		case won != nil:
			return Claim{Status: ClaimAcquired, Record: *won}, nil
		case blocking == nil:
			continue
		case !deduptype.MayTakeOver(*blocking, req.Fingerprint, time.UnixMilli(now)):
			return Claim{Status: deduptype.Classify(*blocking, req.Fingerprint), Record: *blocking}, nil
		}
		taken, blocking, err := s.takeOver(ctx, req, now)
		switch {
		case err != nil:
			return Claim{}, err
		case taken != nil:
			return *taken, nil
		case blocking != nil:
			return Claim{Status: deduptype.Classify(*blocking, req.Fingerprint), Record: *blocking}, nil
		}
	}
	return Claim{}, errors.New("the item kept vanishing under concurrent writes")
}

// create writes a fresh item for req if the key is absent or expired and
// returns its record. When the write is refused, it returns the live record
// that refused it instead, or neither when that one has vanished since.
func (s *DynamoDBStore) create(ctx context.Context, req ClaimRequest, now int64) (won, blocking *Record, err error) {
	rec := freshRecord(req, deduptype.NewOwnerToken(), now)
	_, err = s.client.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:                           aws.String(s.table),
		Item:                                encodeRecord(rec),
		ConditionExpression:                 aws.String("attribute_not_exists(#pk) OR #expires_ms <= :now"),
		ExpressionAttributeNames:            ddbNames(ddbPK, ddbExpiresMs),
		ExpressionAttributeValues:           map[string]types.AttributeValue{":now": ddbNum(now)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err == nil {
		return &rec, nil, nil
	}
	blocking, err = s.refusal(ctx, req.Key, err, now)
	return nil, blocking, err
}

// freshRecord is the record a claim of req by owner creates at now.
func freshRecord(req ClaimRequest, owner string, now int64) Record {
	return Record{
		Key:         req.Key,
		Status:      StatusProcessing,
		Fingerprint: req.Fingerprint,
		Attempts:    1,
		Owner:       owner,
		LeaseUntil:  time.UnixMilli(now + req.Lease.Milliseconds()),
		CreatedAt:   time.UnixMilli(now),
		UpdatedAt:   time.UnixMilli(now),
		ExpiresAt:   time.UnixMilli(now + req.TTL.Milliseconds()),
	}
}

// takeOver makes req the new owner of a live item with req's fingerprint that
// failed retryably or whose lease expired, counting one more attempt. When
// the write is refused, it returns the live record that refused it instead,
// or neither when that one has vanished since.
func (s *DynamoDBStore) takeOver(ctx context.Context, req ClaimRequest, now int64) (taken *Claim, blocking *Record, err error) {
	owner := deduptype.NewOwnerToken()
	lease, expires := now+req.Lease.Milliseconds(), now+req.TTL.Milliseconds()
	out, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(s.table),
		Key:       itemKey(req.Key),
		ConditionExpression: aws.String("#expires_ms > :now AND #fp = :fp AND " +
			"(#status = :retryable OR (#status = :processing AND #lease_until_ms <= :now))"),
		UpdateExpression: aws.String("SET #status = :processing, #attempts = #attempts + :one, #owner = :owner, " +
			"#lease_until_ms = :lease, #updated_ms = :now, #expires_ms = :expires_ms, #expires_at = :expires_at"),
		ExpressionAttributeNames: ddbNames(ddbExpiresMs, ddbFingerprint, ddbStatus, ddbLeaseUntil, ddbAttempts,
			ddbOwner, ddbUpdated, ddbExpiresAt),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":now":        ddbNum(now),
			":fp":         ddbStr(req.Fingerprint),
			":retryable":  ddbStr(string(StatusFailedRetryable)),
			":processing": ddbStr(string(StatusProcessing)),
			":one":        ddbNum(1),
			":owner":      ddbStr(owner),
			":lease":      ddbNum(lease),
			":expires_ms": ddbNum(expires),
			":expires_at": ddbNum(ttlSeconds(expires)),
		},
		ReturnValues:                        types.ReturnValueAllOld,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	if err != nil {
		blocking, err = s.refusal(ctx, req.Key, err, now)
		return nil, blocking, err
	}
	old, err := decodeRecord(out.Attributes)
	if err != nil {
		return nil, nil, err
	}
	rec := old
	rec.Status = StatusProcessing
	rec.Attempts++
	rec.Owner = owner
	rec.LeaseUntil = time.UnixMilli(lease)
	rec.UpdatedAt = time.UnixMilli(now)
	rec.ExpiresAt = time.UnixMilli(expires)
	return &Claim{Status: ClaimAcquired, Record: rec, Previous: old.Status}, nil, nil
}

// refusal turns the error of a conditional claim write into the live record
// that refused it, or nil when there is none, reading the item consistently
// when the service did not return it. Any other error is returned as is.
func (s *DynamoDBStore) refusal(ctx context.Context, key Key, err error, now int64) (*Record, error) {
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return nil, err
	}
	item := ccf.Item
	if item == nil {
		out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
			TableName:      aws.String(s.table),
			Key:            itemKey(key),
			ConsistentRead: aws.Bool(true),
		})
		if err != nil {
			return nil, err
		}
		item = out.Item
	}
	if item == nil {
		return nil, nil
	}
	rec, err := decodeRecord(item)
	if err != nil || rec.ExpiresAt.UnixMilli() <= now {
		return nil, err
	}
	return &rec, nil
}

// ClaimBatch claims distinct keys in PartiQL batches of up to 25 inserts
// (BatchExecuteStatement), at most 16 batches in flight: an insert writes a
// fresh item only where the key has none, and each is answered on its own.
// A key that has an item, live or expired, is then claimed as Claim claims
// it, concurrently with the others.
func (s *DynamoDBStore) ClaimBatch(ctx context.Context, reqs []ClaimRequest) ([]Claim, error) {
	if err := deduptype.ValidateBatch(reqs); err != nil {
		return nil, fmt.Errorf("dedup: dynamodb claim batch: %w", err)
	}
	claims := make([]Claim, len(reqs))
	// sent are the records inserted or maybe inserted, by request: a batch
	// whose answer is lost may have written them, and only their owners can
	// give them back.
	sent := make([]Record, len(reqs))
	rest := make([]bool, len(reqs)) // claimed one by one
	var err error
	if s.perItem.Load() {
		for i := range rest {
			rest[i] = true
		}
	} else {
		err = ddbForEachBatch(ctx, len(reqs), func(ctx context.Context, from, to int) error {
			return s.insertStatements(ctx, reqs[from:to], sent[from:to], claims[from:to], rest[from:to])
		})
	}
	if err == nil {
		errs := make([]error, len(reqs))
		err = ddbForEach(ctx, len(reqs), func(ctx context.Context, i int) error {
			// The other claims go on rather than being canceled: a claim
			// canceled in flight may have been applied unseen, and only a
			// claim that is seen can be given back.
			if rest[i] {
				claims[i], errs[i] = s.Claim(ctx, reqs[i])
			}
			return nil
		})
		err = errors.Join(append(errs, err)...)
	}
	if err != nil {
		s.giveBack(ctx, sent, claims)
		return nil, fmt.Errorf("dedup: dynamodb claim batch: %w", err)
	}
	return claims, nil
}

// insertStatements inserts a fresh item for each of reqs in one
// BatchExecuteStatement, recording each record it sends in sent. A request
// whose insert was refused, or failed on its own, is marked in rest: it is
// claimed one by one.
func (s *DynamoDBStore) insertStatements(ctx context.Context, reqs []ClaimRequest, sent []Record, claims []Claim, rest []bool) error {
	now := time.Now().UnixMilli()
	owners := deduptype.NewOwnerTokens(len(reqs), 0)
	stmts := make([]types.BatchStatementRequest, len(reqs))
	for i := range reqs {
		sent[i] = freshRecord(reqs[i], owners.At(i), now)
		item := encodeRecord(sent[i])
		params := make([]types.AttributeValue, len(ddbFreshAttrs))
		for k, a := range ddbFreshAttrs {
			params[k] = item[a]
		}
		stmts[i] = types.BatchStatementRequest{Statement: aws.String(s.sql.insert), Parameters: params}
	}
	out, err := s.client.BatchExecuteStatement(ctx, &dynamodb.BatchExecuteStatementInput{Statements: stmts})
	if s.partiQLDenied(err) {
		for i := range reqs {
			sent[i], rest[i] = Record{}, true
		}
		return nil
	}
	if err != nil {
		return err
	}
	if len(out.Responses) != len(reqs) {
		return fmt.Errorf("batch of %d statements answered %d", len(reqs), len(out.Responses))
	}
	for i, r := range out.Responses {
		if r.Error == nil {
			claims[i] = Claim{Status: ClaimAcquired, Record: sent[i]}
			continue
		}
		// Refused (DuplicateItem) or failed: not written, so not to give back.
		s.statementDenied(r.Error)
		sent[i], rest[i] = Record{}, true
	}
	return nil
}

// partiQLDenied reports whether err is IAM's refusal of a PartiQL request
// (dynamodb:PartiQLInsert and dynamodb:PartiQLUpdate are permissions of
// their own, which a policy written for PutItem and UpdateItem lacks), and
// if so turns the store to one request per record.
func (s *DynamoDBStore) partiQLDenied(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) && ae.ErrorCode() == "AccessDeniedException" {
		s.perItem.Store(true)
		return true
	}
	return false
}

// statementDenied is partiQLDenied for the error of one statement.
func (s *DynamoDBStore) statementDenied(e *types.BatchStatementError) bool {
	if e.Code == types.BatchStatementErrorCodeEnumAccessDenied {
		s.perItem.Store(true)
		return true
	}
	return false
}

// giveBack releases what a failed ClaimBatch acquired, or may have: the
// records of its inserts and its acquired claims. The caller gets no owner
// token to settle them with, so kept they would hold their keys until the
// lease ran out and count an attempt that never ran. It is best effort: the
// leases free them otherwise.
func (s *DynamoDBStore) giveBack(ctx context.Context, sent []Record, claims []Claim) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	_ = ddbForEach(ctx, len(claims), func(ctx context.Context, i int) error {
		if c := claims[i]; c.Status == ClaimAcquired && c.Record.Owner != sent[i].Owner {
			_ = s.Release(ctx, c.Record.Key, c.Record.Owner)
		}
		if r := sent[i]; r.Owner != "" {
			_ = s.Release(ctx, r.Key, r.Owner)
		}
		return nil
	})
}

// Complete marks the record succeeded with result, if owner still holds it.
func (s *DynamoDBStore) Complete(ctx context.Context, key Key, owner string, result []byte, ttl time.Duration) error {
	now := time.Now().UnixMilli()
	expires := now + ttl.Milliseconds()
	update := "SET #status = :succeeded, #updated_ms = :now, #expires_ms = :expires_ms, #expires_at = :expires_at"
	values := map[string]types.AttributeValue{
		":succeeded":  ddbStr(string(StatusSucceeded)),
		":expires_ms": ddbNum(expires),
		":expires_at": ddbNum(ttlSeconds(expires)),
	}
	if len(result) > 0 {
		update += ", #result = :result"
		values[":result"] = &types.AttributeValueMemberB{Value: result}
	} else {
		update += " REMOVE #result"
	}
	return s.fenced(ctx, "complete", key, owner, now, update, values, ddbStatus, ddbUpdated, ddbExpiresMs, ddbExpiresAt, ddbResult)
}

// ddbStatementBatch is the most statements one BatchExecuteStatement holds.
const ddbStatementBatch = 25

// CompleteBatch completes the records in PartiQL batches of up to 25
// statements (BatchExecuteStatement), each statement an update conditioned
// on the owner as Complete's is and answered on its own; at most 16 batches
// are in flight. A record that could not be completed gets its own error:
// ErrLeaseLost when its condition failed, the statement's or its request's
// error otherwise (a throttled statement, an unreachable endpoint), which
// the wrapper tries again.
func (s *DynamoDBStore) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	if err := deduptype.ValidateCompletions(cs); err != nil {
		return nil, err
	}
	errs := make([]error, len(cs))
	var err error
	if s.perItem.Load() {
		err = s.completeEach(ctx, cs, errs)
	} else {
		err = ddbForEachBatch(ctx, len(cs), func(ctx context.Context, from, to int) error {
			return s.completeStatements(ctx, cs[from:to], errs[from:to])
		})
	}
	if err != nil {
		return nil, fmt.Errorf("dedup: dynamodb complete batch: %w", err)
	}
	return errs, nil
}

// completeStatements completes cs in one BatchExecuteStatement, setting
// errs[i] for each completion i that failed, all of them when the request
// did.
func (s *DynamoDBStore) completeStatements(ctx context.Context, cs []deduptype.Completion, errs []error) error {
	now := time.Now().UnixMilli()
	stmts := make([]types.BatchStatementRequest, len(cs))
	for i := range cs {
		c := &cs[i]
		expires := now + c.TTL.Milliseconds()
		params := []types.AttributeValue{ddbStr(string(StatusSucceeded)), ddbNum(now), ddbNum(expires),
			ddbNum(ttlSeconds(expires))}
		stmt := s.sql.completeNoResult
		if len(c.Result) > 0 {
			stmt = s.sql.completeResult
			params = append(params, &types.AttributeValueMemberB{Value: c.Result})
		}
		params = append(params, ddbStr(dynamoDBPK(c.Key)), ddbStr(c.Owner), ddbStr(string(StatusProcessing)), ddbNum(now))
		stmts[i] = types.BatchStatementRequest{Statement: aws.String(stmt), Parameters: params}
	}
	out, err := s.client.BatchExecuteStatement(ctx, &dynamodb.BatchExecuteStatementInput{Statements: stmts})
	if s.partiQLDenied(err) {
		return s.completeEach(ctx, cs, errs)
	}
	if err == nil && len(out.Responses) != len(cs) {
		err = fmt.Errorf("batch of %d statements answered %d", len(cs), len(out.Responses))
	}
	if err != nil {
		// Each completion of a failed request fails on its own, named, as a
		// Complete would: the other requests of the batch go on.
		for i := range cs {
			errs[i] = fmt.Errorf("dedup: dynamodb complete %s: %w", cs[i].Key, err)
		}
		return nil
	}
	for i, r := range out.Responses {
		c := &cs[i]
		switch {
		case r.Error == nil:
		case s.statementDenied(r.Error):
			errs[i] = s.Complete(ctx, c.Key, c.Owner, c.Result, c.TTL)
		case r.Error.Code == types.BatchStatementErrorCodeEnumConditionalCheckFailed:
			errs[i] = fmt.Errorf("dedup: dynamodb complete %s: %w", cs[i].Key, ErrLeaseLost)
		default:
			errs[i] = fmt.Errorf("dedup: dynamodb complete %s: %s: %s", cs[i].Key, r.Error.Code, aws.ToString(r.Error.Message))
		}
	}
	return nil
}

// completeEach completes cs one request each, at most 16 at a time, setting
// errs[i] for each completion i that failed.
func (s *DynamoDBStore) completeEach(ctx context.Context, cs []deduptype.Completion, errs []error) error {
	return ddbForEach(ctx, len(cs), func(ctx context.Context, i int) error {
		c := &cs[i]
		errs[i] = s.Complete(ctx, c.Key, c.Owner, c.Result, c.TTL)
		return nil
	})
}

// Fail records a failed attempt, if owner still holds the record.
func (s *DynamoDBStore) Fail(ctx context.Context, key Key, owner string, f Failure) error {
	now := time.Now().UnixMilli()
	expires := now + f.TTL.Milliseconds()
	status := StatusFailedRetryable
	if f.Final {
		status = StatusFailedFinal
	}
	update := "SET #status = :failed, #last_error = :error, #first_failure_ms = if_not_exists(#first_failure_ms, :now), " +
		"#last_failure_ms = :now, #updated_ms = :now, #expires_ms = :expires_ms, #expires_at = :expires_at"
	values := map[string]types.AttributeValue{
		":failed":     ddbStr(string(status)),
		":error":      ddbStr(f.Error),
		":expires_ms": ddbNum(expires),
		":expires_at": ddbNum(ttlSeconds(expires)),
	}
	return s.fenced(ctx, "fail", key, owner, now, update, values,
		ddbStatus, ddbLastError, ddbFirstFailure, ddbLastFailure, ddbUpdated, ddbExpiresMs, ddbExpiresAt)
}

// Extend pushes the lease of a held record to lease from now.
func (s *DynamoDBStore) Extend(ctx context.Context, key Key, owner string, lease time.Duration) error {
	now := time.Now().UnixMilli()
	values := map[string]types.AttributeValue{":lease": ddbNum(now + lease.Milliseconds())}
	return s.fenced(ctx, "extend", key, owner, now, "SET #lease_until_ms = :lease, #updated_ms = :now", values,
		ddbLeaseUntil, ddbUpdated)
}

// Release gives back a claim whose handler never started: the record becomes
// claimable at once and the attempt is not counted.
func (s *DynamoDBStore) Release(ctx context.Context, key Key, owner string) error {
	now := time.Now().UnixMilli()
	values := map[string]types.AttributeValue{
		":retryable": ddbStr(string(StatusFailedRetryable)),
		":one":       ddbNum(1),
	}
	return s.fenced(ctx, "release", key, owner, now,
		"SET #status = :retryable, #attempts = #attempts - :one, #lease_until_ms = :now, #updated_ms = :now", values,
		ddbStatus, ddbAttempts, ddbLeaseUntil, ddbUpdated)
}

// fenced applies update to the item of key only while owner holds its live
// lease-bearing record; a refusal is ErrLeaseLost. values gets :now, :owner
// and :processing added; attrs are the attributes update names.
func (s *DynamoDBStore) fenced(ctx context.Context, op string, key Key, owner string, now int64,
	update string, values map[string]types.AttributeValue, attrs ...string) error {
	if err := key.Validate(); err != nil {
		return err
	}
	values[":now"] = ddbNum(now)
	values[":owner"] = ddbStr(owner)
	values[":processing"] = ddbStr(string(StatusProcessing))
	_, err := s.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       itemKey(key),
		ConditionExpression:       aws.String("#owner = :owner AND #status = :processing AND #expires_ms > :now"),
		UpdateExpression:          aws.String(update),
		ExpressionAttributeNames:  ddbNames(append(attrs, ddbOwner, ddbStatus, ddbExpiresMs)...),
		ExpressionAttributeValues: values,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case errors.As(err, &ccf):
		return fmt.Errorf("dedup: dynamodb %s %s: %w", op, key, ErrLeaseLost)
	case err != nil:
		return fmt.Errorf("dedup: dynamodb %s %s: %w", op, key, err)
	}
	return nil
}

// Get returns the live record for key, or ErrNotFound.
func (s *DynamoDBStore) Get(ctx context.Context, key Key) (Record, error) {
	if err := key.Validate(); err != nil {
		return Record{}, err
	}
	out, err := s.client.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(s.table),
		Key:            itemKey(key),
		ConsistentRead: aws.Bool(true),
	})
	if err != nil {
		return Record{}, fmt.Errorf("dedup: dynamodb get %s: %w", key, err)
	}
	if out.Item == nil {
		return Record{}, fmt.Errorf("dedup: dynamodb get %s: %w", key, ErrNotFound)
	}
	rec, err := decodeRecord(out.Item)
	if err != nil {
		return Record{}, fmt.Errorf("dedup: dynamodb get %s: %w", key, err)
	}
	if !rec.ExpiresAt.After(time.Now()) {
		return Record{}, fmt.Errorf("dedup: dynamodb get %s: %w", key, ErrNotFound)
	}
	return rec, nil
}

// Purge deletes the expired items it finds with a full-table scan. It is
// meant for development and tests: in production DynamoDB's TTL deletes
// expired items by itself, at no cost, and reads already ignore them.
//
// Each item is deleted with a condition that it is still expired, so a key
// claimed again after the scan is never lost; BatchWriteItem takes no
// conditions, which rules it out.
func (s *DynamoDBStore) Purge(ctx context.Context) (int, error) {
	now := time.Now().UnixMilli()
	var deleted atomic.Int64
	pages := dynamodb.NewScanPaginator(s.client, &dynamodb.ScanInput{
		TableName:                 aws.String(s.table),
		ConsistentRead:            aws.Bool(true),
		FilterExpression:          aws.String("#expires_ms <= :now"),
		ProjectionExpression:      aws.String("#pk"),
		ExpressionAttributeNames:  ddbNames(ddbPK, ddbExpiresMs),
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": ddbNum(now)},
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return int(deleted.Load()), fmt.Errorf("dedup: dynamodb purge %s: %w", s.table, err)
		}
		err = ddbForEach(ctx, len(page.Items), func(ctx context.Context, i int) error {
			_, err := s.client.DeleteItem(ctx, &dynamodb.DeleteItemInput{
				TableName:                 aws.String(s.table),
				Key:                       map[string]types.AttributeValue{ddbPK: page.Items[i][ddbPK]},
				ConditionExpression:       aws.String("#expires_ms <= :now"),
				ExpressionAttributeNames:  ddbNames(ddbExpiresMs),
				ExpressionAttributeValues: map[string]types.AttributeValue{":now": ddbNum(now)},
			})
			var ccf *types.ConditionalCheckFailedException
			switch {
			case errors.As(err, &ccf):
				return nil
			case err != nil:
				return err
			}
			deleted.Add(1)
			return nil
		})
		if err != nil {
			return int(deleted.Load()), fmt.Errorf("dedup: dynamodb purge %s: %w", s.table, err)
		}
	}
	return int(deleted.Load()), nil
}

// ddbForEach calls fn for 0..n-1 with at most ddbConcurrency calls running,
// and returns the first error; after it, calls not yet started are skipped and
// the context of running ones is cancelled.
func ddbForEach(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
		slots    = make(chan struct{}, ddbConcurrency)
	)
	for i := 0; i < n; i++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() { firstErr = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// ddbForEachBatch calls fn for each run [from, to) of up to
// ddbStatementBatch of n items, as ddbForEach calls it.
func ddbForEachBatch(ctx context.Context, n int, fn func(ctx context.Context, from, to int) error) error {
	return ddbForEach(ctx, (n+ddbStatementBatch-1)/ddbStatementBatch, func(ctx context.Context, b int) error {
		from := b * ddbStatementBatch
		return fn(ctx, from, min(from+ddbStatementBatch, n))
	})
}

// dynamoDBPK returns the partition key of k: scope and event ID joined by
// '#', with '#' and '\' escaped in the scope so that no two keys share one.
func dynamoDBPK(k Key) string {
	scope := strings.NewReplacer(`\`, `\\`, `#`, `\#`).Replace(k.Scope)
	return scope + "#" + k.EventID
}

func itemKey(k Key) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{ddbPK: ddbStr(dynamoDBPK(k))}
}

// encodeRecord returns the item for a freshly created record.
func encodeRecord(r Record) map[string]types.AttributeValue {
	expires := r.ExpiresAt.UnixMilli()
	return map[string]types.AttributeValue{
		ddbPK:          ddbStr(dynamoDBPK(r.Key)),
		ddbScope:       ddbStr(r.Key.Scope),
		ddbEventID:     ddbStr(r.Key.EventID),
		ddbStatus:      ddbStr(string(r.Status)),
		ddbFingerprint: ddbStr(r.Fingerprint),
		ddbAttempts:    ddbNum(int64(r.Attempts)),
		ddbOwner:       ddbStr(r.Owner),
		ddbLeaseUntil:  ddbNum(r.LeaseUntil.UnixMilli()),
		ddbCreated:     ddbNum(r.CreatedAt.UnixMilli()),
		ddbUpdated:     ddbNum(r.UpdatedAt.UnixMilli()),
		ddbExpiresMs:   ddbNum(expires),
		ddbExpiresAt:   ddbNum(ttlSeconds(expires)),
	}
}

// decodeRecord reads an item; any missing or mistyped attribute, or an
// unknown status, is an ErrMalformedRecord.
func decodeRecord(item map[string]types.AttributeValue) (Record, error) {
	d := itemDecoder{item: item}
	r := Record{
		Key:          Key{Scope: d.str(ddbScope, true), EventID: d.str(ddbEventID, true)},
		Status:       Status(d.str(ddbStatus, true)),
		Fingerprint:  d.str(ddbFingerprint, true),
		Attempts:     int(d.num(ddbAttempts, true)),
		Owner:        d.str(ddbOwner, true),
		LeaseUntil:   d.millis(ddbLeaseUntil, true),
		CreatedAt:    d.millis(ddbCreated, true),
		UpdatedAt:    d.millis(ddbUpdated, true),
		ExpiresAt:    d.millis(ddbExpiresMs, true),
		LastError:    d.str(ddbLastError, false),
		FirstFailure: d.millis(ddbFirstFailure, false),
		LastFailure:  d.millis(ddbLastFailure, false),
		Result:       d.bytes(ddbResult),
	}
	if d.err == nil && !r.Status.Valid() {
		d.err = fmt.Errorf("%w: unknown status %q", ErrMalformedRecord, r.Status)
	}
	if d.err != nil {
		return Record{}, d.err
	}
	return r, nil
}

// itemDecoder reads typed attributes of an item, keeping the first error.
type itemDecoder struct {
	item map[string]types.AttributeValue
	err  error
}

func (d *itemDecoder) attr(name string, required bool) types.AttributeValue {
	v, ok := d.item[name]
	if !ok && required && d.err == nil {
		d.err = fmt.Errorf("%w: attribute %s is missing", ErrMalformedRecord, name)
	}
	return v
}

func (d *itemDecoder) wrongType(name, want string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: attribute %s is not of type %s", ErrMalformedRecord, name, want)
	}
}

func (d *itemDecoder) str(name string, required bool) string {
	switch v := d.attr(name, required).(type) {
	case nil:
		return ""
	case *types.AttributeValueMemberS:
		return v.Value
	}
	d.wrongType(name, "S")
	return ""
}

func (d *itemDecoder) num(name string, required bool) int64 {
	switch v := d.attr(name, required).(type) {
	case nil:
		return 0
	case *types.AttributeValueMemberN:
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err == nil {
			return n
		}
	}
	d.wrongType(name, "N (integer)")
	return 0
}

func (d *itemDecoder) millis(name string, required bool) time.Time {
	if _, ok := d.item[name]; !ok && !required {
		return time.Time{}
	}
	return time.UnixMilli(d.num(name, required))
}

func (d *itemDecoder) bytes(name string) []byte {
	switch v := d.attr(name, false).(type) {
	case nil:
		return nil
	case *types.AttributeValueMemberB:
		return v.Value
	}
	d.wrongType(name, "B")
	return nil
}

// ttlSeconds converts an expiry in epoch milliseconds to the epoch seconds of
// the native TTL attribute, rounding up so DynamoDB never deletes an item
// before it expires. Reads and conditions use the exact milliseconds.
func ttlSeconds(ms int64) int64 {
	return (ms + 999) / 1000
}

// ddbNames returns expression attribute names mapping "#a" to a for each a;
// aliasing every attribute avoids DynamoDB's reserved words (status, owner...).
func ddbNames(attrs ...string) map[string]string {
	m := make(map[string]string, len(attrs))
	for _, a := range attrs {
		m["#"+a] = a
	}
	return m
}

func ddbStr(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func ddbNum(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
