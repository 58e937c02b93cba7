package idemhttp_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// allStores are the stores the end-to-end tests run on: memory, PostgreSQL
// and DynamoDB Local (skipped when absent, failing under CI=true).
var allStores = []storeCase{
	{"memory", memoryStore},
	{"postgres", func(t *testing.T) dedup.Store { s, _ := postgresStore(t); return s }},
	{"dynamodb", dynamoStore},
}

// uniqueName returns a table name for t alone.
func uniqueName(prefix string) string { return prefix + strings.ToLower(dedup.NewOwnerToken()[:12]) }

// postgresStore returns a store on a fresh table, dropped when t ends.
func postgresStore(t testing.TB) (*dedup.PostgresStore, *pgxpool.Pool) {
	t.Helper()
	pool := testenv.Postgres(t)
	table := uniqueName("idemhttp_")
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})
	return s, pool
}

func dynamoStore(t *testing.T) dedup.Store {
	t.Helper()
	client := testenv.DynamoDB(t)
	table := uniqueName("idemhttp-")
	if err := dedup.CreateDynamoDBTable(context.Background(), client, table); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	s, err := dedup.NewDynamoDBStore(client, table)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
