package sqsdedup_test

import (
	"context"
	"fmt"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
)

// A Lambda function on a queue subscribed to an SNS topic (raw message
// delivery off): the event ID is the notification's MessageId, the handler
// reads the inner message with UnwrapSNS, and SNS delivering the
// notification twice has one effect.
func ExampleWithSNSEnvelope() {
	w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.LambdaMessages(sqsdedup.WithSNSEnvelope()),
		func(_ context.Context, m events.SQSMessage) error {
			n, err := sqsdedup.UnwrapSNS(m.Body)
			if err != nil {
				return err
			}
			fmt.Printf("charge %s (topic %s)\n", n.Message, n.TopicArn)
			return nil
		},
		dedup.WithScope(dedup.Scope("orders", "charge")), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		panic(err)
	}
	body := `{"Type":"Notification","MessageId":"6c5b5b1f-4c0e-5a3d-9f3e-1b2a3c4d5e6f",` +
		`"TopicArn":"arn:aws:sns:us-east-1:123456789012:orders","Message":"{\"order\":\"o-1\"}",` +
		`"Timestamp":"2026-12-06T18:00:00.123Z","SignatureVersion":"1","Signature":"EXAMPLE",` +
		`"SigningCertURL":"https://sns.us-east-1.amazonaws.com/cert.pem","UnsubscribeURL":"https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"}`
	ev := events.SQSEvent{Records: []events.SQSMessage{{MessageId: "sqs-1", Body: body}, {MessageId: "sqs-2", Body: body}}}
	resp, _ := sqsdedup.LambdaHandler(w)(context.Background(), ev)
	fmt.Println("failures:", len(resp.BatchItemFailures))
	// Output:
	// charge {"order":"o-1"} (topic arn:aws:sns:us-east-1:123456789012:orders)
	// failures: 0
}
