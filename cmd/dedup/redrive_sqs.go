package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
)

// redriveSQS sends the dead letters of an SQS queue back to their origin
// queues: receive, send, delete.
func redriveSQS(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive sqs")
	dlq := registerSQSDLQ(fs)
	var r redrive
	if err := r.start(ctx, fs, args, "dlq-url"); err != nil {
		return err
	}
	defer r.close()
	return dlq.drain(ctx, &r, out, func(client *sqs.Client, m types.Message) (bool, error) {
		return r.sqsLetter(ctx, client, m, out)
	})
}

// sqsDLQ is an SQS dead-letter queue a redrive reads, as its flags name it
// (redrive sqs, redrive kinesis).
type sqsDLQ struct{ endpoint, url *string }

func registerSQSDLQ(fs *flag.FlagSet) sqsDLQ {
	return sqsDLQ{
		endpoint: fs.String("sqs", env("DEDUP_SQS_ENDPOINT", "aws"), "SQS endpoint URL, or aws (DEDUP_SQS_ENDPOINT)"),
		url:      fs.String("dlq-url", "", "the dead-letter queue's URL (required)"),
	}
}

// drain redrives the dead letters of q through send, which reports whether
// it sent a letter back: one sent back is deleted only after the send
// succeeded, so that a redrive stopped halfway loses nothing and resumes
// where it stopped; one skipped, or whose send failed, stays in the queue
// and is made visible again at the end.
func (q sqsDLQ) drain(ctx context.Context, r *redrive, out io.Writer, send func(*sqs.Client, types.Message) (bool, error)) error {
	client, err := sqsClient(ctx, *q.endpoint)
	if err != nil {
		return err
	}
	dlqURL := q.url
	if _, err := client.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: dlqURL}); err != nil {
		return fmt.Errorf("queue %s: %w", *dlqURL, err)
	}
	var kept []types.Message // skipped, failed, or read in a dry run: made visible again at the end
	defer func() {
		for _, m := range kept {
			_, _ = client.ChangeMessageVisibility(context.WithoutCancel(ctx), &sqs.ChangeMessageVisibilityInput{
				QueueUrl: dlqURL, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0})
		}
	}()
	receive := func() ([]types.Message, error) {
		recv, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: dlqURL, MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 300,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			return nil, fmt.Errorf("receive from %s: %w", *dlqURL, err)
		}
		return recv.Messages, nil
	}
	return drain(ctx, r, out, receive, func(m types.Message) error {
		r.sum.read++
		sent, err := send(client, m)
		if err != nil || !sent {
			kept = append(kept, m)
			return err
		}
		r.sum.sent++
		if _, err := client.DeleteMessage(context.WithoutCancel(ctx), &sqs.DeleteMessageInput{QueueUrl: dlqURL, ReceiptHandle: m.ReceiptHandle}); err != nil {
			return fmt.Errorf("sent message %s back but could not delete it from %s (a second redrive sends it again, and the consumer's dedup answers it): %w",
				aws.ToString(m.MessageId), *dlqURL, err)
		}
		return nil
	})
}

// readSQSLetter reads the dead letter m: its metadata, where it is and its
// redrive count. A letter whose metadata is malformed reads as one without
// metadata, which is skipped.
func readSQSLetter(m types.Message) (letter, map[string]string) {
	meta, err := sqsdedup.DeadLetterMetadata(m)
	if err != nil {
		meta = nil
	}
	return readLetter("message "+aws.ToString(m.MessageId), func(name string) string {
		if name == redriveCountHeader {
			return aws.ToString(m.MessageAttributes[name].StringValue)
		}
		return meta[name]
	}), meta
}

// sqsLetter sends one dead letter back to its origin queue, or skips it;
// sent reports that it went back.
func (r *redrive) sqsLetter(ctx context.Context, client *sqs.Client, m types.Message, out io.Writer) (sent bool, err error) {
	l, meta := readSQSLetter(m)
	l.origin = meta["dedup-origin-queue"]
	if send, err := r.admit(ctx, l, l.origin, out); !send {
		return false, err
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(l.origin), MessageBody: m.Body,
		MessageAttributes: map[string]types.MessageAttributeValue{}}
	for name, v := range m.MessageAttributes {
		if !strings.HasPrefix(name, dedup.MetadataPrefix) && name != redriveCountHeader {
			in.MessageAttributes[name] = v
		}
	}
	in.MessageAttributes[redriveCountHeader] = types.MessageAttributeValue{DataType: aws.String("Number"),
		StringValue: aws.String(strconv.Itoa(l.redrives + 1))}
	if strings.HasSuffix(l.origin, ".fifo") {
		group := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		in.MessageGroupId = aws.String(cmp.Or(group, l.key.EventID))
		in.MessageDeduplicationId = aws.String(l.key.EventID + "-redrive-" + strconv.Itoa(l.redrives+1))
	}
	if _, err := client.SendMessage(ctx, in); err != nil {
		return false, fmt.Errorf("send %s back to %s: %w", l.key, l.origin, err)
	}
	return true, nil
}
