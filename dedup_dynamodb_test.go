package dedup_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// newDynamoDBTable creates a table of its own for the test, deleted after it.
func newDynamoDBTable(t testing.TB, client *dynamodb.Client) string {
	t.Helper()
	table := "dedup-test-" + deduptype.NewOwnerToken()[:12]
	ctx := context.Background()
	if err := dedup.CreateDynamoDBTable(ctx, client, dedup.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return table
}

func newDynamoDBStore(t testing.TB) (*dedup.DynamoDBStore, *dynamodb.Client, string) {
	t.Helper()
	client := testenv.DynamoDB(t)
	table := newDynamoDBTable(t, client)
	store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return store, client, table
}

func claimReq(scope, id, fp string) dedup.ClaimRequest {
	return dedup.ClaimRequest{
		Key:         dedup.Key{Scope: scope, EventID: id},
		Fingerprint: fp,
		Lease:       time.Minute,
		TTL:         time.Hour,
	}
}

func TestCreateDynamoDBTableIsIdempotent(t *testing.T) {
	client := testenv.DynamoDB(t)
	table := newDynamoDBTable(t, client)
	ctx := context.Background()
	if err := dedup.CreateDynamoDBTable(ctx, client, dedup.WithTable(table)); err != nil {
		t.Fatalf("second create: %v", err)
	}
	ttl, err := client.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatal(err)
	}
	if d := ttl.TimeToLiveDescription; aws.ToString(d.AttributeName) != "expires_at" || d.TimeToLiveStatus != types.TimeToLiveStatusEnabled {
		t.Fatalf("TTL = %s on %q, want ENABLED on expires_at", d.TimeToLiveStatus, aws.ToString(d.AttributeName))
	}
	desc, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	if err != nil {
		t.Fatal(err)
	}
	if ks := desc.Table.KeySchema; len(ks) != 1 || aws.ToString(ks[0].AttributeName) != "pk" || ks[0].KeyType != types.KeyTypeHash {
		t.Fatalf("key schema = %+v, want pk HASH", ks)
	}
}

func TestDynamoDBRejectsInvalidTableNames(t *testing.T) {
	client := testenv.DynamoDB(t)
	for _, name := range []string{"", "ab", "has space", "semi;colon", strings.Repeat("x", 256)} {
		if _, err := dedup.NewDynamoDBStore(client, dedup.WithTable(name)); err == nil {
			t.Errorf("NewDynamoDBStore(%q) succeeded, want an error", name)
		}
		if err := dedup.CreateDynamoDBTable(context.Background(), client, dedup.WithTable(name)); err == nil {
			t.Errorf("CreateDynamoDBTable(%q) succeeded, want an error", name)
		}
	}
	if _, err := dedup.NewDynamoDBStore(nil, dedup.WithTable("valid-name")); err == nil {
		t.Error("NewDynamoDBStore(nil client) succeeded, want an error")
	}
}

func TestDynamoDBClaimCompleteRoundTrip(t *testing.T) {
	store, _, _ := newDynamoDBStore(t)
	ctx := context.Background()
	req := claimReq("billing", "evt-1", "fp-1")

	c, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != dedup.ClaimAcquired || c.Record.Attempts != 1 || c.Record.Status != dedup.StatusProcessing || c.Previous != "" {
		t.Fatalf("first claim = %v %+v, want acquired, attempt 1, processing", c.Status, c.Record)
	}
	again, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if again.Status != dedup.ClaimInFlight || again.Record.Owner != c.Record.Owner {
		t.Fatalf("second claim = %v (owner %s), want in-flight held by %s", again.Status, again.Record.Owner, c.Record.Owner)
	}
	if err := store.Complete(ctx, req.Key, "not-the-owner", nil, time.Hour); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("complete by a stranger: %v, want ErrLeaseLost", err)
	}
	if err := store.Complete(ctx, req.Key, c.Record.Owner, []byte("receipt-42"), time.Hour); err != nil {
		t.Fatal(err)
	}
	dup, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if dup.Status != dedup.ClaimDuplicate || string(dup.Record.Result) != "receipt-42" {
		t.Fatalf("claim after complete = %v result %q, want duplicate with receipt-42", dup.Status, dup.Record.Result)
	}
	got, err := store.Get(ctx, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != dedup.StatusSucceeded || got.Key != req.Key || got.Attempts != 1 || string(got.Result) != "receipt-42" {
		t.Fatalf("Get = %+v, want succeeded after one attempt with the result", got)
	}
	if err := store.Complete(ctx, req.Key, c.Record.Owner, nil, time.Hour); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("completing twice: %v, want ErrLeaseLost", err)
	}
}

func TestDynamoDBTakeoverCountsAttemptsAndKeepsFailures(t *testing.T) {
	store, _, _ := newDynamoDBStore(t)
	ctx := context.Background()
	req := claimReq("billing", "evt-retry", "fp-1")

	first, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Fail(ctx, req.Key, first.Record.Owner, dedup.Failure{Error: "boom", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	second, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if second.Status != dedup.ClaimAcquired || second.Record.Attempts != 2 || second.Previous != dedup.StatusFailedRetryable {
		t.Fatalf("claim after failure = %v attempt %d previous %q, want acquired, attempt 2, previous FAILED_RETRYABLE",
			second.Status, second.Record.Attempts, second.Previous)
	}
	if second.Record.LastError != "boom" || second.Record.FirstFailure.IsZero() {
		t.Fatalf("takeover lost the failure history: %+v", second.Record)
	}
	got, err := store.Get(ctx, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got.Owner != second.Record.Owner || got.Attempts != 2 || !got.LeaseUntil.Equal(second.Record.LeaseUntil) {
		t.Fatalf("stored %+v, claim returned %+v", got, second.Record)
	}
	if err := store.Fail(ctx, req.Key, first.Record.Owner, dedup.Failure{Error: "late", TTL: time.Hour}); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("fail by the previous owner: %v, want ErrLeaseLost", err)
	}
}

func TestDynamoDBKeysWithHashesDoNotCollide(t *testing.T) {
	store, _, _ := newDynamoDBStore(t)
	ctx := context.Background()
	for _, req := range []dedup.ClaimRequest{claimReq(`a#b`, "c", "fp"), claimReq("a", `b#c`, "fp"), claimReq(`a\`, `#b#c`, "fp")} {
		c, err := store.Claim(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if c.Status != dedup.ClaimAcquired {
			t.Fatalf("claim %s = %v, want acquired: it collided with another key", req.Key, c.Status)
		}
	}
}

// rawItem returns a well-formed SUCCEEDED item written without the store,
// expiring at expires for reads and at ttl for DynamoDB's own TTL.
func rawItem(scope, id string, expires, ttl time.Time) map[string]types.AttributeValue {
	n := func(t time.Time) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(t.UnixMilli(), 10)}
	}
	return map[string]types.AttributeValue{
		"pk":             &types.AttributeValueMemberS{Value: scope + "#" + id},
		"scope":          &types.AttributeValueMemberS{Value: scope},
		"event_id":       &types.AttributeValueMemberS{Value: id},
		"status":         &types.AttributeValueMemberS{Value: "SUCCEEDED"},
		"fp":             &types.AttributeValueMemberS{Value: "fp"},
		"attempts":       &types.AttributeValueMemberN{Value: "1"},
		"owner":          &types.AttributeValueMemberS{Value: "someone"},
		"lease_until_ms": n(expires),
		"created_ms":     n(expires),
		"updated_ms":     n(expires),
		"expires_ms":     n(expires),
		"expires_at":     &types.AttributeValueMemberN{Value: strconv.FormatInt(ttl.Unix(), 10)},
	}
}

func TestDynamoDBMalformedItem(t *testing.T) {
	store, client, table := newDynamoDBStore(t)
	ctx := context.Background()
	expires := time.Now().Add(time.Hour)
	valid := func(id string) map[string]types.AttributeValue { return rawItem("malformed", id, expires, expires) }
	cases := map[string]func(map[string]types.AttributeValue){
		"unknown-status":  func(it map[string]types.AttributeValue) { it["status"] = &types.AttributeValueMemberS{Value: "DONE"} },
		"missing-owner":   func(it map[string]types.AttributeValue) { delete(it, "owner") },
		"attempts-string": func(it map[string]types.AttributeValue) { it["attempts"] = &types.AttributeValueMemberS{Value: "1"} },
		"lease-not-integer": func(it map[string]types.AttributeValue) {
			it["lease_until_ms"] = &types.AttributeValueMemberN{Value: "1.5"}
		},
		"result-string": func(it map[string]types.AttributeValue) { it["result"] = &types.AttributeValueMemberS{Value: "x"} },
	}
	for id, corrupt := range cases {
		t.Run(id, func(t *testing.T) {
			item := valid(id)
			corrupt(item)
			if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
				t.Fatal(err)
			}
			key := dedup.Key{Scope: "malformed", EventID: id}
			if _, err := store.Get(ctx, key); !errors.Is(err, dedup.ErrMalformedRecord) {
				t.Errorf("Get: %v, want ErrMalformedRecord", err)
			}
			if _, err := store.Claim(ctx, claimReq(key.Scope, key.EventID, "fp")); !errors.Is(err, dedup.ErrMalformedRecord) {
				t.Errorf("Claim: %v, want ErrMalformedRecord", err)
			}
		})
	}
	// The unmodified item decodes: the cases above fail for their one defect.
	if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: valid("ok")}); err != nil {
		t.Fatal(err)
	}
	if c, err := store.Claim(ctx, claimReq("malformed", "ok", "fp")); err != nil || c.Status != dedup.ClaimDuplicate {
		t.Fatalf("claim on the valid item = %v, %v; want duplicate", c.Status, err)
	}
}

// failOperation returns a copy of client whose calls of operation fail with
// err before reaching the network, and are not retried.
func failOperation(client *dynamodb.Client, operation string, err error) *dynamodb.Client {
	return dynamodb.New(client.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("injectFault",
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					if awsmiddleware.GetOperationName(ctx) == operation {
						return middleware.FinalizeOutput{}, middleware.Metadata{}, err
					}
					return next.HandleFinalize(ctx, in)
				}), middleware.Before)
		})
	})
}

// recordOperations returns a copy of client that appends the name of every
// operation it sends to *ops; it is not safe for concurrent use.
func recordOperations(client *dynamodb.Client, ops *[]string) *dynamodb.Client {
	return dynamodb.New(client.Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("recordOperation",
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					*ops = append(*ops, awsmiddleware.GetOperationName(ctx))
					return next.HandleInitialize(ctx, in)
				}), middleware.Before)
		})
	})
}

func TestDynamoDBRefusedClaimTakesOneRoundTrip(t *testing.T) {
	_, client, table := newDynamoDBStore(t)
	var ops []string
	store, err := dedup.NewDynamoDBStore(recordOperations(client, &ops), dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := claimReq("billing", "evt-rt", "fp-1")
	c, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, req.Key, c.Record.Owner, []byte("r"), time.Hour); err != nil {
		t.Fatal(err)
	}
	ops = ops[:0]
	for _, fp := range []string{"fp-1", "fp-2"} {
		if _, err := store.Claim(ctx, claimReq("billing", "evt-rt", fp)); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Join(ops, ",") != "PutItem,PutItem" {
		t.Fatalf("a duplicate and a conflict sent %v, want one PutItem each (the refusal returns the item)", ops)
	}
}

func TestDynamoDBServiceErrorsPropagate(t *testing.T) {
	store, client, table := newDynamoDBStore(t)
	ctx := context.Background()
	req := claimReq("billing", "evt-fault", "fp-1")
	first, err := store.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Fail(ctx, req.Key, first.Record.Owner, dedup.Failure{Error: "boom", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	injected := errors.New("injected: service unavailable")
	faulty, err := dedup.NewDynamoDBStore(failOperation(client, "UpdateItem", injected), dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	// The refused create succeeds, the takeover's UpdateItem fails.
	_, err = faulty.Claim(ctx, req)
	if !errors.Is(err, injected) || !strings.Contains(err.Error(), "dedup: dynamodb claim billing/evt-fault: ") {
		t.Fatalf("claim: %v, want the injected error wrapped with the operation and key", err)
	}
	err = faulty.Extend(ctx, req.Key, first.Record.Owner, time.Minute)
	if !errors.Is(err, injected) || errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("extend: %v, want the injected error and not ErrLeaseLost", err)
	}
	got, err := store.Get(ctx, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != dedup.StatusFailedRetryable || got.Attempts != 1 {
		t.Fatalf("record changed by failed calls: %+v", got)
	}

	missing, err := dedup.NewDynamoDBStore(client, dedup.WithTable("dedup-no-such-table"))
	if err != nil {
		t.Fatal(err)
	}
	var notFound *types.ResourceNotFoundException
	if _, err := missing.Claim(ctx, req); !errors.As(err, &notFound) {
		t.Fatalf("claim on a missing table: %v, want ResourceNotFoundException", err)
	}
}

func TestDynamoDBPurgeDeletesOnlyExpired(t *testing.T) {
	store, client, table := newDynamoDBStore(t)
	ctx := context.Background()
	// Expired for reads, but not yet deleted by DynamoDB's TTL, which lags
	// (up to days on AWS): what Purge is for.
	past, later := time.Now().Add(-time.Second), time.Now().Add(time.Hour)
	for i := range 30 {
		item := rawItem("purge", "old-"+strconv.Itoa(i), past, later)
		if _, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item}); err != nil {
			t.Fatal(err)
		}
	}
	live := claimReq("purge", "live", "fp")
	if _, err := store.Claim(ctx, live); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(ctx, dedup.Key{Scope: "purge", EventID: "old-0"}); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Get of an expired record: %v, want ErrNotFound", err)
	}
	n, err := store.Purge(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 30 {
		t.Fatalf("Purge removed %d, want 30", n)
	}
	scan, err := client.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if scan.Count != 1 {
		t.Fatalf("%d items left after Purge, want only the live one", scan.Count)
	}
	if _, err := store.Get(ctx, live.Key); err != nil {
		t.Fatalf("live record after purge: %v", err)
	}
	if n, err := store.Purge(ctx); err != nil || n != 0 {
		t.Fatalf("second Purge = %d, %v; want 0", n, err)
	}
}

func BenchmarkDynamoDBClaimComplete(b *testing.B) {
	store, _, _ := newDynamoDBStore(b)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		c, err := store.Claim(ctx, claimReq("bench", strconv.Itoa(i), "fp"))
		if err != nil {
			b.Fatal(err)
		}
		if err := store.Complete(ctx, c.Record.Key, c.Record.Owner, nil, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDynamoDBBatch measures what a consumer's batch of 32 new events
// costs the store: one ClaimBatch and one CompleteBatch. An op is one event.
func BenchmarkDynamoDBBatch(b *testing.B) {
	const batch = 32
	store, _, _ := newDynamoDBStore(b)
	ctx := context.Background()
	reqs := make([]dedup.ClaimRequest, batch)
	cs := make([]deduptype.Completion, batch)
	b.ReportAllocs()
	for n := 0; n < b.N; n += batch {
		for i := range reqs {
			reqs[i] = claimReq("bench", strconv.Itoa(n+i), "fp")
		}
		claims, err := store.ClaimBatch(ctx, reqs)
		if err != nil {
			b.Fatal(err)
		}
		for i, c := range claims {
			if c.Status != dedup.ClaimAcquired {
				b.Fatalf("claim %d: %v", i, c.Status)
			}
			cs[i] = deduptype.Completion{Key: c.Record.Key, Owner: c.Record.Owner, TTL: time.Hour}
		}
		errs, err := store.CompleteBatch(ctx, cs)
		if err != nil {
			b.Fatal(err)
		}
		for i, err := range errs {
			if err != nil {
				b.Fatalf("completion %d: %v", i, err)
			}
		}
	}
}

func TestDynamoDBClaimBatchAnswersInOrder(t *testing.T) {
	store, _, _ := newDynamoDBStore(t)
	ctx := context.Background()
	first, err := store.Claim(ctx, claimReq("batch", "failed", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Fail(ctx, first.Record.Key, first.Record.Owner, dedup.Failure{Error: "boom", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"conflict", "held"} {
		if _, err := store.Claim(ctx, claimReq("batch", id, "a")); err != nil {
			t.Fatal(err)
		}
	}
	reqs := []dedup.ClaimRequest{
		claimReq("batch", "conflict", "b"), // the record keeps fingerprint a
		claimReq("batch", "new", "x"),
		claimReq("batch", "failed", "a"), // takes the failed record over
		claimReq("batch", "held", "a"),
	}
	claims, err := store.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	want := []dedup.ClaimStatus{dedup.ClaimConflict, dedup.ClaimAcquired, dedup.ClaimAcquired, dedup.ClaimInFlight}
	for i, c := range claims {
		if c.Status != want[i] {
			t.Errorf("claim %d (%s, %s) = %v, want %v", i, reqs[i].Key, reqs[i].Fingerprint, c.Status, want[i])
		}
	}
	if claims[2].Record.Attempts != 2 || claims[2].Previous != dedup.StatusFailedRetryable {
		t.Errorf("takeover = attempt %d previous %s", claims[2].Record.Attempts, claims[2].Previous)
	}
	bad := []dedup.ClaimRequest{claimReq("batch", "other", "x"), claimReq("batch", "", "x")}
	if _, err := store.ClaimBatch(ctx, bad); !errors.Is(err, dedup.ErrInvalidKey) {
		t.Fatalf("batch with an empty ID: %v, want ErrInvalidKey", err)
	}
}

// A role allowed PutItem and UpdateItem but not PartiQL (IAM's
// dynamodb:PartiQLInsert and dynamodb:PartiQLUpdate): the batches go on one
// request per record.
func TestDynamoDBBatchesWithoutPartiQL(t *testing.T) {
	_, client, table := newDynamoDBStore(t)
	denied := &smithy.GenericAPIError{Code: "AccessDeniedException", Message: "not authorized to perform: dynamodb:PartiQLInsert"}
	store, err := dedup.NewDynamoDBStore(failOperation(client, "BatchExecuteStatement", denied), dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reqs := make([]dedup.ClaimRequest, 30)
	for i := range reqs {
		reqs[i] = claimReq("denied", strconv.Itoa(i), "fp")
	}
	for round := range 2 { // the first round finds PartiQL refused, the second knows
		claims, err := store.ClaimBatch(ctx, reqs)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		cs := make([]deduptype.Completion, 0, len(claims))
		for i, c := range claims {
			if c.Status != dedup.ClaimAcquired {
				t.Fatalf("round %d, claim %d: %v", round, i, c.Status)
			}
			cs = append(cs, deduptype.Completion{Key: c.Record.Key, Owner: c.Record.Owner, Result: []byte("r"), TTL: time.Hour})
		}
		errs, err := store.CompleteBatch(ctx, cs)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, c := range cs {
			if errs[i] != nil {
				t.Fatalf("round %d, completion %d: %v", round, i, errs[i])
			}
			rec, err := store.Get(ctx, c.Key)
			if err != nil || rec.Status != dedup.StatusSucceeded || string(rec.Result) != "r" {
				t.Fatalf("round %d, %s: %+v, %v", round, c.Key, rec, err)
			}
		}
		for i := range reqs {
			reqs[i] = claimReq("denied", "second-"+strconv.Itoa(i), "fp")
		}
	}
}

// A request of a batch completion that fails fails each of its completions
// on its own, named by key as a Complete's error is: the wrapper tries them
// again and its log says which events may run again.
func TestDynamoDBCompleteBatchFailsEachRecordOfAFailedRequest(t *testing.T) {
	good, client, table := newDynamoDBStore(t)
	down := errors.New("connection reset by peer")
	store, err := dedup.NewDynamoDBStore(failOperation(client, "BatchExecuteStatement", down), dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var cs []deduptype.Completion
	for i := range 30 {
		c, err := good.Claim(ctx, claimReq("unreachable", strconv.Itoa(i), "fp"))
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, deduptype.Completion{Key: c.Record.Key, Owner: c.Record.Owner, TTL: time.Hour})
	}
	errs, err := store.CompleteBatch(ctx, cs)
	if err != nil {
		t.Fatalf("CompleteBatch = %v; want an error per completion", err)
	}
	for i, c := range cs {
		if !errors.Is(errs[i], down) || !strings.Contains(errs[i].Error(), "complete "+c.Key.String()+":") {
			t.Errorf("completion %d: %v; want %q naming %s", i, errs[i], down, c.Key)
		}
		if rec, err := good.Get(ctx, c.Key); err != nil || rec.Status != dedup.StatusProcessing {
			t.Errorf("%s: %v, %v; want it still processing", c.Key, rec.Status, err)
		}
	}
}
