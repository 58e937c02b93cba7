package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
)

// redriveKinesis puts the dead letters of Kinesis records, which
// lambdastreamdedup's Kinesis handler sent to an SQS queue, back on their
// streams with their partition keys: receive, put, delete. A Kinesis
// record carries no attributes, so the redrive count cannot travel with
// it: each letter reads as never redriven, and -max-redrives guards only
// against letters that say otherwise.
func redriveKinesis(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive kinesis")
	dlq := registerSQSDLQ(fs)
	endpoint := fs.String("kinesis", env("DEDUP_KINESIS_ENDPOINT", "aws"), "Kinesis endpoint URL, or aws (DEDUP_KINESIS_ENDPOINT)")
	stream := fs.String("stream", "", "put every letter on this stream (default: the stream its stream-arn attribute names)")
	var r redrive
	if err := r.start(ctx, fs, args, "dlq-url"); err != nil {
		return err
	}
	defer r.close()
	cfg, err := awsConfig(ctx, *endpoint)
	if err != nil {
		return err
	}
	streams := kinesis.NewFromConfig(cfg, func(o *kinesis.Options) {
		if *endpoint != "aws" {
			o.BaseEndpoint = aws.String(*endpoint)
		}
	})
	return dlq.drain(ctx, &r, out, func(_ *sqs.Client, m types.Message) (bool, error) {
		return r.kinesisLetter(ctx, streams, *stream, m, out)
	})
}

// kinesisLetter puts one dead letter back on its stream (stream, when not
// empty), or skips it; sent reports that it went back.
func (r *redrive) kinesisLetter(ctx context.Context, client *kinesis.Client, stream string, m types.Message, out io.Writer) (sent bool, err error) {
	l, _ := readSQSLetter(m)
	attr := func(name string) string { return aws.ToString(m.MessageAttributes[name].StringValue) }
	arn, partitionKey := attr(lambdastreamdedup.HeaderStreamARN), attr(lambdastreamdedup.HeaderPartitionKey)
	var why string
	switch name, ok := kinesisStreamName(arn); {
	case partitionKey == "":
		why = "no " + lambdastreamdedup.HeaderPartitionKey + " attribute: not a Kinesis record's letter"
	case stream != "":
		l.origin = stream
	case !ok:
		why = "its " + lambdastreamdedup.HeaderStreamARN + " attribute names no Kinesis stream (-stream)"
	default:
		l.origin = name
	}
	if why != "" {
		r.sum.skip(why, l.where)
		return false, nil
	}
	if send, err := r.admit(ctx, l, "stream "+l.origin, out); !send {
		return false, err
	}
	if _, err := client.PutRecord(ctx, &kinesis.PutRecordInput{StreamName: aws.String(l.origin),
		PartitionKey: aws.String(partitionKey), Data: []byte(aws.ToString(m.Body))}); err != nil {
		return false, fmt.Errorf("put %s back on stream %s: %w", l.key, l.origin, err)
	}
	return true, nil
}

// kinesisStreamName returns the stream name of a Kinesis stream ARN
// (arn:aws:kinesis:region:account:stream/name).
func kinesisStreamName(arn string) (string, bool) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) < 6 || parts[0] != "arn" || parts[2] != "kinesis" {
		return "", false
	}
	name, ok := strings.CutPrefix(parts[5], "stream/")
	return name, ok && name != "" && !strings.Contains(name, "/")
}
