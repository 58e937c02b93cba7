// Command sqs-dynamodb is a worker that consumes orders from an SQS queue,
// charges each order once however often it is delivered, and parks orders
// that can never be charged in a dead-letter queue. Dedup records live in
// DynamoDB. See README.md to run it against the local test services.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	dynamodbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
)

type options struct {
	region, sqsEndpoint, dynamoEndpoint string
	queue, dlq, table                   string
	setup                               bool
	send                                int
	maxAttempts                         int
}

// order is the message body.
type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func main() {
	var o options
	flag.StringVar(&o.region, "region", "us-east-1", "AWS region")
	flag.StringVar(&o.sqsEndpoint, "sqs-endpoint", os.Getenv("DEDUP_SQS_ENDPOINT"), "SQS endpoint (empty: AWS)")
	flag.StringVar(&o.dynamoEndpoint, "dynamodb-endpoint", os.Getenv("DEDUP_DYNAMODB_ENDPOINT"), "DynamoDB endpoint (empty: AWS)")
	flag.StringVar(&o.queue, "queue", "orders", "name of the queue to consume")
	flag.StringVar(&o.dlq, "dlq", "orders-dlq", "name of the dead-letter queue")
	flag.StringVar(&o.table, "table", "dedup-orders", "DynamoDB table of dedup records")
	flag.BoolVar(&o.setup, "setup", false, "create the queues and the table if missing")
	flag.IntVar(&o.send, "send", 0, "send this many demo orders (each twice, plus one poison order) and exit")
	flag.IntVar(&o.maxAttempts, "max-attempts", 3, "attempts before an order is dead-lettered")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil {
		log.Error("sqs-dynamodb", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, log *slog.Logger) error {
	sqsClient, dynamoClient, err := clients(ctx, o)
	if err != nil {
		return err
	}
	queueURL, dlqURL, err := queues(ctx, sqsClient, o, log)
	if err != nil {
		return err
	}
	if o.send > 0 {
		return sendOrders(ctx, sqsClient, queueURL, o.send)
	}
	if o.setup {
		if err := setupTable(ctx, dynamoClient, o.table, log); err != nil {
			return err
		}
	}
	store, err := dedup.NewDynamoDBStore(dynamoClient, dedup.WithTable(o.table))
	if err != nil {
		return err
	}
	sink, err := sqsdedup.NewSink(sqsClient, dlqURL)
	if err != nil {
		return err
	}
	w, err := dedup.Wrap(store, sqsdedup.Messages(queueURL), charge(log),
		dedup.WithScope(dedup.Scope("orders", "charge")),
		dedup.WithSink(sink),
		dedup.WithMaxAttempts(o.maxAttempts),
		dedup.WithLogger(log),
		dedup.WithObserver(func(_ context.Context, r dedup.Result) {
			log.Info("delivery", slog.Any("key", r.Key), slog.String("outcome", r.Outcome.String()),
				slog.Int("attempts", r.Attempts))
		}),
	)
	if err != nil {
		return err
	}
	consumer, err := sqsdedup.NewConsumer(sqsClient, queueURL, w, sqsdedup.WithLogger(log))
	if err != nil {
		return err
	}
	log.Info("consuming; Ctrl-C to stop", slog.String("queue", queueURL), slog.String("dlq", dlqURL))
	if err := consumer.Run(ctx); err != nil {
		return err
	}
	log.Info("stopped: settled orders deleted, the rest given back to the queue")
	return nil
}

// setupTable creates the table of dedup records unless it exists, saying
// which.
func setupTable(ctx context.Context, c *dynamodb.Client, table string, log *slog.Logger) error {
	_, err := c.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	var missing *dynamodbtypes.ResourceNotFoundException
	switch {
	case err == nil:
		log.Info("setup: table exists", slog.String("table", table))
		return nil
	case !errors.As(err, &missing):
		return fmt.Errorf("describe table %s: %w", table, err)
	}
	if err := dedup.CreateDynamoDBTable(ctx, c, dedup.WithTable(table)); err != nil {
		return err
	}
	log.Info("setup: created table (on-demand billing, TTL on expires_at)", slog.String("table", table))
	return nil
}

// charge is the business handler: it must not charge an order twice, which
// the wrapper guarantees for redeliveries and duplicate sends alike.
func charge(log *slog.Logger) dedup.Handler[types.Message] {
	return func(ctx context.Context, m types.Message) error {
		var o order
		if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &o); err != nil {
			return dedup.Permanent(fmt.Errorf("undecodable order: %w", err))
		}
		if o.Amount < 0 {
			return errors.New("payment provider refused a negative amount")
		}
		log.Info("charged", slog.String("order", o.ID), slog.Int("amount", o.Amount))
		return nil
	}
}

func clients(ctx context.Context, o options) (*sqs.Client, *dynamodb.Client, error) {
	opts := []func(*config.LoadOptions) error{config.WithRegion(o.region)}
	if o.sqsEndpoint != "" || o.dynamoEndpoint != "" {
		// Local services accept any credentials.
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	sqsClient := sqs.NewFromConfig(cfg, func(so *sqs.Options) {
		if o.sqsEndpoint != "" {
			so.BaseEndpoint = aws.String(o.sqsEndpoint)
		}
	})
	dynamoClient := dynamodb.NewFromConfig(cfg, func(do *dynamodb.Options) {
		if o.dynamoEndpoint != "" {
			do.BaseEndpoint = aws.String(o.dynamoEndpoint)
			do.DisableValidateResponseChecksum = true // DynamoDB Local's error responses fail it
		}
	})
	return sqsClient, dynamoClient, nil
}

// queues returns the URLs of the queue and the DLQ, creating them with
// -setup (and saying which it created).
func queues(ctx context.Context, c *sqs.Client, o options, log *slog.Logger) (string, string, error) {
	url := func(name string) (string, error) {
		out, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
		var missing *types.QueueDoesNotExist
		switch {
		case err == nil:
			if o.setup {
				log.Info("setup: queue exists", slog.String("queue", aws.ToString(out.QueueUrl)))
			}
			return aws.ToString(out.QueueUrl), nil
		case !o.setup || !errors.As(err, &missing):
			return "", fmt.Errorf("queue %s (run with -setup to create it): %w", name, err)
		}
		created, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name),
			Attributes: map[string]string{"VisibilityTimeout": "30"}})
		if err != nil {
			return "", fmt.Errorf("create queue %s: %w", name, err)
		}
		log.Info("setup: created queue (visibility timeout 30 s)", slog.String("queue", aws.ToString(created.QueueUrl)))
		return aws.ToString(created.QueueUrl), nil
	}
	queueURL, err := url(o.queue)
	if err != nil {
		return "", "", err
	}
	dlqURL, err := url(o.dlq)
	return queueURL, dlqURL, err
}

// sendOrders sends n orders twice each, as a producer retrying after a lost
// acknowledgement would, and one order that can never be charged.
func sendOrders(ctx context.Context, c *sqs.Client, queueURL string, n int) error {
	stamp := time.Now().Format("150405")
	send := func(o order) error {
		body, _ := json.Marshal(o) // an order always marshals
		_, err := c.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl:    aws.String(queueURL),
			MessageBody: aws.String(string(body)),
			MessageAttributes: map[string]types.MessageAttributeValue{
				sqsdedup.DefaultIDAttribute: {DataType: aws.String("String"), StringValue: aws.String(o.ID)},
			},
		})
		return err
	}
	for i := range n {
		o := order{ID: fmt.Sprintf("order-%s-%d", stamp, i), Amount: 100 + i}
		for range 2 {
			if err := send(o); err != nil {
				return err
			}
		}
	}
	if err := send(order{ID: "order-" + stamp + "-poison", Amount: -1}); err != nil {
		return err
	}
	fmt.Printf("sent %d orders twice each and one poison order to %s\n", n, queueURL)
	return nil
}
