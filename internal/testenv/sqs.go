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

// emulatorGaps lists, by emulator (DEDUP_SQS_EMULATOR), the tests that need
// a feature of real SQS that emulator lacks, with the reason: a top-level
// test by its name, a subtest by its full name ("Test/sub"). [SQS] skips
// them on that emulator only, CI included. Each reason comes with a minimal
// reproduction against the emulator; docs/testing.md lists every
// divergence the tests found.
var emulatorGaps = map[string]map[string]string{
	// local-aws-sqs 2.0.2 (scripts/local-aws-sqs.sh).
	"local-aws-sqs": {
		// Send A1 then A2 with MessageGroupId "A" to a FIFO queue; receive
		// one message (A1, visibility 60 s); receive again: real SQS returns
		// nothing until A1 is deleted or visible, local-aws-sqs returns A2.
		"TestFIFOOrder": "FIFO queues do not hold back a group while one of its messages is in flight",
		// Receive a message (ApproximateReceiveCount 1), ChangeMessageVisibility
		// to 0, receive again: real SQS says 2, local-aws-sqs 3.
		"TestReceiveCountCountsAsAttempts": "ChangeMessageVisibility increments ApproximateReceiveCount",
		"TestPoisonMessageIsDeadLettered":  "ChangeMessageVisibility increments ApproximateReceiveCount",
		// The same, in the conformance suite: the count read beside the
		// store's dead-letters the poison message after 2 handler calls.
		"TestConformance/adaptertest/PoisonAfterMaxAttempts": "ChangeMessageVisibility increments ApproximateReceiveCount",

		// The same, through the SNS and EventBridge envelopes.
		"TestConformanceSNSEnvelope/adaptertest/PoisonAfterMaxAttempts":         "ChangeMessageVisibility increments ApproximateReceiveCount",
		"TestConformanceEventBridgeEnvelope/adaptertest/PoisonAfterMaxAttempts": "ChangeMessageVisibility increments ApproximateReceiveCount",

		// (1) Receive one message with visibility 60 s, then GetQueueAttributes:
		// real SQS says ApproximateNumberOfMessages 0, NotVisible 1;
		// local-aws-sqs says 1 and 1. (2) On a queue with a 1 s visibility
		// timeout, send one message and receive with MaxNumberOfMessages 10,
		// WaitTimeSeconds 1: real SQS answers at once; local-aws-sqs answers
		// when the wait ends, by which time the message is visible again and
		// taken a second time, so the answer holds it twice.
		"TestBadInput": "ApproximateNumberOfMessages counts in-flight messages, and a long poll holds what it took until the wait ends",
	},
}

// SQS returns a client for the SQS endpoint at DEDUP_SQS_ENDPOINT (default
// http://127.0.0.1:4566, fauxqs started by scripts/fauxqs.sh), or marks t
// unavailable when it does not answer. When DEDUP_SQS_EMULATOR names the
// emulator behind the endpoint, a test that emulator cannot pass (see
// emulatorGaps) is skipped.
func SQS(t testing.TB) *sqs.Client {
	t.Helper()
	if emulator, reason := emulatorGap(t.Name()); reason != "" {
		t.Skipf("%s lacks a feature of real SQS: %s", emulator, reason)
	}
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

// emulatorGap returns the emulator named by DEDUP_SQS_EMULATOR and why it
// cannot pass the test named name or a test that name is a subtest of, or
// "" when it can.
func emulatorGap(name string) (emulator, reason string) {
	emulator = Env("DEDUP_SQS_EMULATOR", "")
	gaps := emulatorGaps[emulator]
	for prefix := name; ; {
		if reason := gaps[prefix]; reason != "" {
			return emulator, reason
		}
		i := strings.LastIndexByte(prefix, '/')
		if i < 0 {
			return emulator, ""
		}
		prefix = prefix[:i]
	}
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
