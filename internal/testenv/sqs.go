package testenv

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
)

// SQS returns a client for the SQS endpoint at DEDUP_SQS_ENDPOINT (default
// http://127.0.0.1:4566, fauxqs started by scripts/fauxqs.sh), or marks t
// unavailable when it does not answer.
func SQS(t testing.TB) *sqs.Client {
	t.Helper()
	endpoint := Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566")
	client := sqs.New(sqs.Options{
		BaseEndpoint: aws.String(endpoint),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := client.ListQueues(ctx, &sqs.ListQueuesInput{MaxResults: aws.Int32(1)}); err != nil {
		Unavailable(t, "SQS at "+endpoint, err)
	}
	return client
}

// SQSQueue creates a uniquely named queue with attrs (a FIFO queue when
// attrs has FifoQueue=true), deletes it when the test ends, and returns its
// URL.
func SQSQueue(t testing.TB, client *sqs.Client, attrs map[string]string) string {
	t.Helper()
	name := "dedup-test-" + strings.ToLower(rand.Text()[:16])
	if strings.EqualFold(attrs["FifoQueue"], "true") {
		name += ".fifo"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		t.Fatalf("create queue %s: %v", name, err)
	}
	url := aws.ToString(out.QueueUrl)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}); err != nil {
			t.Logf("delete queue %s: %v", url, err)
		}
	})
	return url
}
