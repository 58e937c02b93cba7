package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/sqsbody"
)

// runSQS consumes a queue on fauxqs through sqsdedup.Consumer with its
// defaults, which claims each batch's messages (a receive's, or under a
// backlog those of up to four receives in a row) in one store call and
// completes them together, over PostgreSQL or DynamoDB.
func runSQS(storeKind string) rowRun {
	return func(ctx context.Context, cfg config, m *meter) error {
		name := "sqs-" + storeKind
		client, url, drop, err := openQueue(ctx, cfg, m)
		if err != nil {
			return err
		}
		defer drop()

		var store dedup.Store
		switch storeKind {
		case "postgres":
			s, _, closeStore, err := openPostgresStore(ctx, cfg, m, "sqs")
			if err != nil {
				return err
			}
			defer closeStore()
			store = s
		case "dynamodb":
			s, drop, err := openDynamoDBStore(ctx, cfg, m)
			if err != nil {
				return err
			}
			defer drop()
			store = s
		}
		msgs := sqsdedup.Messages(url)
		id := msgs.EventID
		msgs.EventID = func(msg types.Message) (string, error) {
			s, err := id(msg)
			if err == nil {
				m.entries.enter(s, now())
			}
			return s, err
		}
		w, err := dedup.Wrap(store, msgs, func(context.Context, types.Message) error { return nil }, wrapperOpts(name, m)...)
		if err != nil {
			return err
		}
		c, err := sqsdedup.NewConsumer(client, url, w,
			sqsdedup.WithWaitTime(time.Second),
			// A duplicate whose original is still running elsewhere comes
			// back soon: after a second, SQS's unit. (One whose original
			// this consumer is handling is a duplicate once that settles.)
			sqsdedup.WithInFlightDelay(200*time.Millisecond))
		if err != nil {
			return err
		}
		m.begin()
		m.started()
		return c.Run(ctx)
	}
}

// openQueue returns a client of the SQS endpoint, whose calls m counts, and
// a new queue holding the row's events, with a function that deletes it.
func openQueue(ctx context.Context, cfg config, m *meter) (*sqs.Client, string, func(), error) {
	client := sqs.New(sqs.Options{
		BaseEndpoint: aws.String(cfg.SQS),
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
		HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConnsPerHost = 32
		}),
		APIOptions: []func(*middleware.Stack) error{m.sqs.apiOption},
	}, sqsbody.KeepConnection) // as sqsdedup sends its own calls
	queue := "dedupbench-" + deduptype.NewOwnerToken()[:12]
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(queue),
		Attributes: map[string]string{"VisibilityTimeout": "30"}})
	if err != nil {
		return nil, "", nil, fmt.Errorf("create queue on %s: %w (run `make services`)", cfg.SQS, err)
	}
	url := aws.ToString(out.QueueUrl)
	drop := func() {
		client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}) //nolint:errcheck
	}
	if err := sendEvents(ctx, client, url, cfg); err != nil {
		drop()
		return nil, "", nil, err
	}
	return client, url, drop, nil
}

// runSQSNone receives and deletes the queue's messages, ten at a time, with
// no dedup: what the SQS endpoint and its SDK cost on their own.
func runSQSNone(ctx context.Context, cfg config, m *meter) error {
	client, url, drop, err := openQueue(ctx, cfg, m)
	if err != nil {
		return err
	}
	defer drop()
	m.begin()
	m.started()
	for ctx.Err() == nil {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"}})
		if err != nil {
			return ctxOr(ctx, err)
		}
		if len(out.Messages) == 0 {
			continue
		}
		entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
		for i, msg := range out.Messages {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: msg.ReceiptHandle}
		}
		if _, err := client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}); err != nil {
			return ctxOr(ctx, err)
		}
		m.settle(dedup.OutcomeProcessed, int64(len(out.Messages)))
	}
	return nil
}

// ctxOr returns err, or nil once ctx is done: the row has finished.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// sendEvents sends the row's events, duplicates shuffled in as for Kafka,
// ten per SendMessageBatch.
func sendEvents(ctx context.Context, client *sqs.Client, url string, cfg config) error {
	rng := rand.New(rand.NewPCG(1, uint64(cfg.Records)))
	ids := make([]int, 0, cfg.Records)
	for i := range cfg.Unique {
		ids = append(ids, i)
	}
	for len(ids) < cfg.Records {
		ids = append(ids, rng.IntN(cfg.Unique))
	}
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	for start := 0; start < len(ids); start += 10 {
		var entries []types.SendMessageBatchRequestEntry
		for k, i := range ids[start:min(start+10, len(ids))] {
			id := "evt-" + strconv.Itoa(i)
			entries = append(entries, types.SendMessageBatchRequestEntry{
				Id:          aws.String(strconv.Itoa(k)),
				MessageBody: aws.String(fmt.Sprintf(`{"id":%d,"customer":%d,"cents":%d}`, i, i%997, 100+i%9973)),
				MessageAttributes: map[string]types.MessageAttributeValue{
					sqsdedup.DefaultIDAttribute: {DataType: aws.String("String"), StringValue: aws.String(id)},
				},
			})
		}
		out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			return fmt.Errorf("send events: %w", err)
		}
		if len(out.Failed) > 0 {
			return fmt.Errorf("send events: %d entries failed", len(out.Failed))
		}
	}
	return nil
}
