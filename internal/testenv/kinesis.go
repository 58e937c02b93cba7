package testenv

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
)

// Kinesis returns a client for the Kinesis endpoint at
// DEDUP_KINESIS_ENDPOINT (default http://127.0.0.1:4569, kinesalite started
// by scripts/kinesalite.sh), or marks t unavailable when it does not answer.
func Kinesis(t testing.TB) *kinesis.Client {
	t.Helper()
	endpoint := Env("DEDUP_KINESIS_ENDPOINT", "http://127.0.0.1:4569")
	client := kinesis.New(kinesis.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := client.ListStreams(ctx, &kinesis.ListStreamsInput{Limit: aws.Int32(1)}); err != nil {
		Unavailable(t, "Kinesis at "+endpoint, err)
	}
	return client
}

// KinesisStream creates a uniquely named stream of one shard, waits until it
// is active, deletes it when the test ends, and returns its name and ARN.
func KinesisStream(t testing.TB, client *kinesis.Client) (name, arn string) {
	t.Helper()
	name = "dedup-test-" + strings.ToLower(rand.Text()[:16])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := client.CreateStream(ctx, &kinesis.CreateStreamInput{StreamName: aws.String(name), ShardCount: aws.Int32(1)}); err != nil {
		t.Fatalf("create stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := client.DeleteStream(ctx, &kinesis.DeleteStreamInput{StreamName: aws.String(name)}); err != nil {
			t.Logf("delete stream %s: %v", name, err)
		}
	})
	for {
		out, err := client.DescribeStreamSummary(ctx, &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(name)})
		if err != nil {
			t.Fatalf("describe stream %s: %v", name, err)
		}
		if s := out.StreamDescriptionSummary; s.StreamStatus == types.StreamStatusActive {
			return name, aws.ToString(s.StreamARN)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("stream %s not active within 2 minutes", name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
