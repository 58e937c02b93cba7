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
