package sqsdedup_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/redisstore"
)

// storeCase opens one kind of store for a test.
type storeCase struct {
	name string
	open func(t *testing.T) dedup.Store
}

// stores lists the stores the end-to-end tests run with, each on a table of
// its own.
func stores() []storeCase {
	return []storeCase{
		{"memory", func(*testing.T) dedup.Store { return dedup.NewMemoryStore() }},
		{"postgres", postgresStore},
		{"dynamodb", dynamoDBStore},
		{"redis", redisStore},
	}
}

func tableName(prefix string) string { return prefix + strings.ToLower(rand.Text()[:12]) }

func postgresStore(t *testing.T) dedup.Store {
	pool := testenv.Postgres(t)
	table := tableName("sqsdedup_test_")
	s, err := dedup.NewPostgresStore(pool, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
			t.Errorf("drop %s: %v", table, err)
		}
	})
	return s
}

func dynamoDBStore(t *testing.T) dedup.Store {
	client := testenv.DynamoDB(t)
	table := tableName("sqsdedup-test-")
	if err := dedup.CreateDynamoDBTable(context.Background(), client, dedup.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)}); err != nil {
			t.Errorf("delete table %s: %v", table, err)
		}
	})
	s, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func redisStore(t *testing.T) dedup.Store {
	s, err := redisstore.New(testenv.Redis(t), redisstore.WithKeyPrefix(tableName("sqsdedup-test-")+":"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}
