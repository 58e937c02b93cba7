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
			// A SUCCEEDED record whose lease and expiry are infinite: no
			// time a record may hold.
			_, err := pool.Exec(ctx, `INSERT INTO dedup_wrapper_test (scope, event_id, status, fingerprint,
				attempts, owner, lease_until, created_at, updated_at, expires_at)
				VALUES ($1, 'malformed', 2, '\x00'::bytea || convert_to('fp', 'UTF8'), 1, '\x00'::bytea || convert_to('o', 'UTF8'),
					'infinity', now(), now(), 'infinity')`, scope)
			require.NoError(t, err)
			t.Cleanup(func() {
				_, _ = pool.Exec(context.Background(), `DELETE FROM dedup_wrapper_test WHERE scope = $1`, scope)
			})
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
