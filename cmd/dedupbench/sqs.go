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
)

// runSQS consumes a queue on fauxqs through sqsdedup.Consumer, whose workers
// run one message each through Wrapper.Handle, over PostgreSQL or DynamoDB.
func runSQS(storeKind string) func(ctx context.Context, cfg config, m *meter) error {
	return func(ctx context.Context, cfg config, m *meter) error {
		name := "sqs-" + storeKind
		client := sqs.New(sqs.Options{
			BaseEndpoint: aws.String(cfg.SQS),
			Region:       "us-east-1",
			Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
			HTTPClient: awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
				t.MaxIdleConnsPerHost = 32
			}),
			APIOptions: []func(*middleware.Stack) error{m.sqs.apiOption},
		})
		queue := "dedupbench-" + dedup.NewOwnerToken()[:12]
		out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(queue),
			Attributes: map[string]string{"VisibilityTimeout": "30"}})
		if err != nil {
			return fmt.Errorf("create queue on %s: %w (run `make services`)", cfg.SQS, err)
		}
		url := aws.ToString(out.QueueUrl)
		defer client.DeleteQueue(context.Background(), &sqs.DeleteQueueInput{QueueUrl: aws.String(url)}) //nolint:errcheck
		if err := sendEvents(ctx, client, url, cfg); err != nil {
			return err
		}

		var store dedup.Store
		switch storeKind {
		case "postgres":
			s, _, closeStore, err := openPostgresStore(ctx, cfg, m, "dedupbench_sqs")
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
			// A duplicate whose original is still running comes back soon.
			sqsdedup.WithInFlightDelay(200*time.Millisecond))
		if err != nil {
			return err
		}
		m.begin()
		m.started()
		return c.Run(ctx)
	}
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
