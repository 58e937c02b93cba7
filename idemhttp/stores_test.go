package idemhttp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/redisstore"
)

// allStores are the stores the end-to-end tests run on: memory, PostgreSQL,
// DynamoDB Local and Redis (skipped when absent, failing under CI=true).
var allStores = []storeCase{
	{"memory", memoryStore},
	{"postgres", func(t *testing.T) dedup.Store { s, _ := postgresStore(t); return s }},
	{"dynamodb", dynamoStore},
	{"redis", func(t *testing.T) dedup.Store { s, _ := redisStore(t); return s }},
}

// uniqueName returns a table name for t alone.
func uniqueName(prefix string) string {
	return prefix + strings.ToLower(deduptype.NewOwnerToken()[:12])
}

// postgresStore returns a store on a fresh table, dropped when t ends.
func postgresStore(t testing.TB) (*dedup.PostgresStore, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.Postgres(t)
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(recordsTable(t, pool)))
	if err != nil {
		t.Fatal(err)
	}
	return s, pool
}

// recordsTable creates a fresh dedup table on pool, dropped when t ends, and
// returns its name.
func recordsTable(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := uniqueName("idemhttp_")
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(name))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	return name
}

func dynamoStore(t *testing.T) dedup.Store {
	t.Helper()
	client := testenv.DynamoDB(t)
	table := uniqueName("idemhttp-")
	if err := dedup.CreateDynamoDBTable(context.Background(), client, dedup.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	s, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// redisStore returns a store under a key prefix of t's own, whose keys are
// deleted when t ends.
func redisStore(t testing.TB) (*redisstore.Store, *redis.Client) {
	t.Helper()
	s, client, _ := redisStorePrefix(t)
	return s, client
}

// redisStorePrefix is redisStore, and the prefix of the store's keys.
func redisStorePrefix(t testing.TB) (*redisstore.Store, *redis.Client, string) {
	t.Helper()
	client := testenv.Redis(t)
	prefix := uniqueName("idemhttp-test-") + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
	})
	s, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return s, client, prefix
}
