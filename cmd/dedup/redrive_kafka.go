package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup"
)

// redriveKafka sends the dead letters of a Kafka topic back to their origin
// topics. It reads the topic in a consumer group and commits each letter's
// offset once the letter is sent back (or skipped), so that a redrive
// stopped halfway resumes where it stopped, with nothing sent twice but the
// letter in flight at the interruption, which the consumer's dedup answers.
func redriveKafka(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive kafka")
	brokers := fs.String("brokers", env("DEDUP_KAFKA_BROKERS", "127.0.0.1:9092"), "Kafka bootstrap brokers, comma-separated (DEDUP_KAFKA_BROKERS)")
	dlq := fs.String("dlq", "", "the dead-letter topic (required)")
	group := fs.String("group", "dedup-redrive", "the consumer group whose offsets mark the redrive's progress")
	idle := fs.Duration("idle", 3*time.Second, "stop once no dead letter came for this long")
	var r redrive
	if err := r.start(ctx, fs, args, "dlq"); err != nil {
		return err
	}
	defer r.close()
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(*brokers, ",")...)}
	producer, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer producer.Close()
	if err := topicExists(ctx, producer, *dlq); err != nil {
		return err
	}
	consumer, err := kgo.NewClient(append(opts, kgo.ConsumerGroup(*group), kgo.ConsumeTopics(*dlq),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		return err
	}
	defer consumer.Close()

	poll := func() ([]*kgo.Record, error) {
		pctx, cancel := context.WithTimeout(ctx, *idle)
		defer cancel()
		fetches := consumer.PollFetches(pctx)
		return fetches.Records(), fetchError(fetches)
	}
	return drain(ctx, &r, out, poll, func(rec *kgo.Record) error {
		return r.kafkaLetter(ctx, producer, consumer, rec, out)
	})
}

// kafkaLetter redrives or skips one dead letter, then commits its offset.
func (r *redrive) kafkaLetter(ctx context.Context, producer, consumer *kgo.Client, rec *kgo.Record, out io.Writer) error {
	r.sum.read++
	header := func(name string) string {
		for _, h := range rec.Headers {
			if h.Key == name {
				return string(h.Value)
			}
		}
		return ""
	}
	l := readLetter(fmt.Sprintf("%s/%d@%d", rec.Topic, rec.Partition, rec.Offset), header)
	l.origin = header("dedup-origin-topic")
	if l.origin == "" {
		l.origin = header("kafka_dlt-original-topic")
	}
	if send, err := r.admit(ctx, l, l.origin, out); err != nil {
		return err
	} else if send {
		back := &kgo.Record{Topic: l.origin, Key: rec.Key, Value: rec.Value}
		for _, h := range rec.Headers {
			if !strings.HasPrefix(h.Key, dedup.MetadataPrefix) && !strings.HasPrefix(h.Key, "kafka_dlt-") && h.Key != redriveCountHeader {
				back.Headers = append(back.Headers, h)
			}
		}
		back.Headers = append(back.Headers, kgo.RecordHeader{Key: redriveCountHeader, Value: []byte(strconv.Itoa(l.redrives + 1))})
		if err := producer.ProduceSync(ctx, back).FirstErr(); err != nil {
			return fmt.Errorf("send %s back to %s: %w", l.key, l.origin, err)
		}
		r.sum.sent++
	}
	if !r.yes {
		return nil
	}
	if err := consumer.CommitRecords(context.WithoutCancel(ctx), rec); err != nil {
		return fmt.Errorf("commit the redrive's progress: %w", err)
	}
	return nil
}

// topicExists fails when topic is unknown to the cluster.
func topicExists(ctx context.Context, client *kgo.Client, topic string) error {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, client)
	if err != nil {
		return fmt.Errorf("cannot reach Kafka: %w", err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("topic %s: metadata answered %d topics", topic, len(resp.Topics))
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("topic %s does not exist", topic)
		}
		return fmt.Errorf("topic %s: %w", topic, err)
	}
	return nil
}

// fetchError returns the first error of fetches that is not the end of a
// poll.
func fetchError(fetches kgo.Fetches) error {
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, kgo.ErrClientClosed) {
			continue
		}
		return fmt.Errorf("read %s: %w", fe.Topic, fe.Err)
	}
	return nil
}
