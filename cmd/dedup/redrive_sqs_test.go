package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/sqsbody"
	"github.com/dedupkit/dedup/internal/testenv"
)

// Dead letters on an SQS queue go back to their origin queue with their
// attributes and a redrive count, their records parked for good are reset,
// and they leave the dead-letter queue; a letter redriven too often already
// is skipped and stays there, and a second redrive sends nothing.
func TestRedriveSQS(t *testing.T) {
	ctx := context.Background()
	client := testenv.SQS(t)
	origin := testenv.SQSQueue(t, client, nil)
	dlq := testenv.SQSQueue(t, client, nil)
	dsn, table, store, _ := postgresTable(t)
	sink, err := sqsdedup.NewSink(client, dlq)
	require.NoError(t, err)
	scope := dedup.Scope("queue", "apply")
	park := func(id string, extra ...dedup.Header) {
		key := dedup.Key{Scope: scope, EventID: id}
		c, err := store.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "f", Lease: time.Minute, TTL: time.Hour})
		require.NoError(t, err)
		require.NoError(t, store.Fail(ctx, key, c.Record.Owner, dedup.Failure{Final: true, Error: "bug", TTL: time.Hour}))
		require.NoError(t, sink.Send(ctx, dedup.DeadLetter{Payload: []byte("body-" + id), Reason: dedup.ReasonPermanent,
			Error: "bug", Attempts: 1, EventID: id, Scope: scope, LastFailure: time.Now(),
			Headers: append([]dedup.Header{{Key: sqsdedup.DefaultIDAttribute, Value: []byte(id), Type: "String"}}, extra...),
			Origin:  dedup.Origin{QueueURL: origin, MessageID: "m-" + id}}))
	}
	for i := range 5 {
		park("s" + strconv.Itoa(i))
	}
	park("looping", dedup.Header{Key: redriveCountHeader, Value: []byte("3"), Type: "Number"})

	redrive := func(extra ...string) (int, string, string) {
		return cli(t, append([]string{"redrive", "sqs", "-sqs", testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
			"-dlq-url", dlq, "-postgres", dsn, "-table", table}, extra...)...)
	}
	code, out, errOut := redrive()
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "would send back 5")
	code, out, errOut = redrive("-yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "sent back 5, skipped 1")
	require.Contains(t, out, "redriven 3 times already")

	got := map[string]string{}
	for len(got) < 5 {
		recv, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(origin), MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}}, sqsbody.KeepConnection)
		require.NoError(t, err)
		require.NotEmpty(t, recv.Messages, "origin queue holds %d of 5", len(got))
		for _, m := range recv.Messages {
			id := aws.ToString(m.MessageAttributes[sqsdedup.DefaultIDAttribute].StringValue)
			require.Equal(t, "body-"+id, aws.ToString(m.Body))
			require.Equal(t, "1", aws.ToString(m.MessageAttributes[redriveCountHeader].StringValue))
			_, meta := m.MessageAttributes[sqsdedup.MetadataAttribute]
			require.False(t, meta, "the dead letter's metadata is not sent back")
			got[id] = aws.ToString(m.Body)
		}
	}
	for id := range got {
		_, err := store.Get(ctx, dedup.Key{Scope: scope, EventID: id})
		require.ErrorIs(t, err, dedup.ErrNotFound, "%s's record was reset", id)
	}
	left := visible(t, client, dlq)
	require.Equal(t, []string{"looping"}, left, "only the skipped letter stays")

	code, out, _ = redrive("-yes")
	require.Equal(t, 0, code)
	require.Contains(t, out, "sent back 0, skipped 1")
}

// visible returns the event IDs of the messages a queue holds, making them
// visible again.
func visible(t *testing.T, client *sqs.Client, url string) []string {
	t.Helper()
	recv, err := client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(url),
		MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}, VisibilityTimeout: 1},
		sqsbody.KeepConnection)
	require.NoError(t, err)
	var ids []string
	for _, m := range recv.Messages {
		meta, err := sqsdedup.DeadLetterMetadata(m)
		require.NoError(t, err)
		ids = append(ids, meta["dedup-event-id"])
		_, err = client.ChangeMessageVisibility(context.Background(), &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(url),
			ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0})
		require.NoError(t, err)
	}
	return ids
}
