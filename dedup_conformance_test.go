package dedup_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) { deduptest.Run(t, dedup.NewMemoryStore()) })
	t.Run("postgres", func(t *testing.T) {
		pool := testenv.Postgres(t)
		// A table of its own: the suite's Purge case must not race another purger.
		table := "dedup_conformance_" + deduptype.NewOwnerToken()[:12]
		s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Migrate(t.Context()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{table}.Sanitize()); err != nil {
				t.Error(err)
			}
		})
		deduptest.Run(t, s)
	})
	t.Run("dynamodb", func(t *testing.T) {
		client := testenv.DynamoDB(t)
		table := newDynamoDBTable(t, client)
		// DynamoDB Local's TTL job deletes expired items at moments of its
		// own, which would race the suite's Purge count; reads ignore expired
		// items either way, so the suite runs with Purge as the only deleter.
		_, err := client.UpdateTimeToLive(context.Background(), &dynamodb.UpdateTimeToLiveInput{
			TableName:               aws.String(table),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String("expires_at"), Enabled: aws.Bool(false)},
		})
		if err != nil {
			t.Fatal(err)
		}
		store, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
		if err != nil {
			t.Fatal(err)
		}
		deduptest.Run(t, store)
	})
}
