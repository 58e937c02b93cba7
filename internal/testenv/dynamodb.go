package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// DynamoDB returns a client for DynamoDB Local at DEDUP_DYNAMODB_ENDPOINT
// (default http://127.0.0.1:8000), or marks t unavailable when it does not
// answer.
func DynamoDB(t testing.TB) *dynamodb.Client {
	t.Helper()
	endpoint := Env("DEDUP_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000")
	client := dynamodb.New(dynamodb.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
		// DynamoDB Local's error responses fail the CRC32 check with a warning.
		DisableValidateResponseChecksum: true,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := client.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)}); err != nil {
		Unavailable(t, "DynamoDB Local at "+endpoint, err)
	}
	return client
}
