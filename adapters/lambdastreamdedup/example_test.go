package lambdastreamdedup_test

import (
	"context"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
)

// A Lambda function on a Kinesis stream: each record's effect once, the
// first unsettled record reported, poison records parked in the sink. In a
// function, pass the handler to lambda.Start, and the sink to an SQS queue
// (sqsdedup.NewSink).
func Example() {
	charge := func(_ context.Context, r events.KinesisEventRecord) error {
		fmt.Printf("charge %s\n", r.Kinesis.Data)
		return nil
	}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), lambdastreamdedup.KinesisMessages(), charge,
		dedup.WithScope(dedup.Scope("orders-stream", "charge")), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		panic(err)
	}
	handler := lambdastreamdedup.KinesisHandler(w) // lambda.Start(handler)

	rec := events.KinesisEventRecord{EventID: "shardId-000000000000:4959", EventSourceArn: "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
		Kinesis: events.KinesisRecord{PartitionKey: "customer-1", SequenceNumber: "4959", Data: []byte(`{"order":"o-1"}`)}}
	for range 2 { // Lambda retries the batch: the second time is a duplicate
		resp, _ := handler(context.Background(), events.KinesisEvent{Records: []events.KinesisEventRecord{rec}})
		fmt.Println("failures:", len(resp.BatchItemFailures))
	}
	// Output:
	// charge {"order":"o-1"}
	// failures: 0
	// failures: 0
}
