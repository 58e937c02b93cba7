package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A batch claim that fails on one key (here a malformed record) gives back
// the keys it acquired: the caller has no owner token to settle them with.
// (They stayed claimed, so each retry of the batch held them for a lease
// and counted an attempt that never ran: found by the bad-input campaign in
// reliability/.)
func TestFailedClaimBatchGivesBackItsClaims(t *testing.T) {
	ctx := context.Background()
	for name, setup := range map[string]func(t *testing.T, scope string) dedup.Store{
		"postgres": func(t *testing.T, scope string) dedup.Store {
			pool := testenv.Postgres(t)
			store := newPostgresStore(t, pool)
			_, err := pool.Exec(ctx, `INSERT INTO dedup_wrapper_test (scope, event_id, status, fingerprint,
				attempts, owner, lease_until, created_at, updated_at, expires_at)
				VALUES ($1, 'malformed', 'SUCCEEDED', 'fp', 1, 'o', 'infinity', now(), now(), now() + interval '1 hour')`, scope)
			require.NoError(t, err)
			return store
		},
		"dynamodb": func(t *testing.T, scope string) dedup.Store {
			store, client, table := newDynamoDBStore(t)
			item := rawItem(scope, "malformed", time.Now().Add(time.Hour), time.Now().Add(time.Hour))
			item["attempts"] = &types.AttributeValueMemberS{Value: "one"}
			_, err := client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
			require.NoError(t, err)
			return store
		},
	} {
		t.Run(name, func(t *testing.T) {
			scope := uniqueScope(t)
			store := setup(t, scope)
			_, err := store.ClaimBatch(ctx, []dedup.ClaimRequest{
				claimReq(scope, "before", "fp"), claimReq(scope, "malformed", "fp"), claimReq(scope, "after", "fp"),
			})
			require.True(t, errors.Is(err, dedup.ErrMalformedRecord), "ClaimBatch: %v", err)
			for _, id := range []string{"before", "after"} {
				c, err := store.Claim(ctx, claimReq(scope, id, "fp"))
				require.NoError(t, err)
				require.Equal(t, dedup.ClaimAcquired, c.Status, "%s is still held by the failed batch", id)
				require.Equal(t, 1, c.Record.Attempts, "%s: the failed batch counted an attempt", id)
			}
		})
	}
}
