package sqsreliability_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/sqsbody"
)

// soak reports whether DEDUP_SOAK=1 asks for the long campaigns.
func soak() bool { return crashtest.Soak() }

// runID returns a short identifier unique to one run, for table, queue and
// scope names.
func runID() string { return crashtest.RunID() }

// event is one logical event of a campaign.
type event struct {
	id     string
	body   string
	poison bool
}

// plan is a campaign's events and the messages that carry them: every event
// once, a share of them again (same event-id, same body), shuffled, so that
// some copies arrive together and others long after the first.
type plan struct {
	events   []event
	messages []event
	dups     int
	poison   int
}

func newPlan(prefix string, n int, dupRate, poisonRate float64, rng *rand.Rand) *plan {
	p := &plan{}
	for i := range n {
		e := event{id: fmt.Sprintf("%s-%05d", prefix, i)}
		e.poison = rng.Float64() < poisonRate
		if e.poison {
			p.poison++
		}
		e.body = fmt.Sprintf(`{"event":%q,"n":%d,"poison":%t}`, e.id, i, e.poison)
		p.events = append(p.events, e)
		p.messages = append(p.messages, e)
		if rng.Float64() < dupRate {
			p.messages = append(p.messages, e)
			p.dups++
		}
	}
	rng.Shuffle(len(p.messages), func(i, j int) { p.messages[i], p.messages[j] = p.messages[j], p.messages[i] })
	return p
}

func (p *plan) good() int { return len(p.events) - p.poison }

func isPoison(body string) bool { return strings.Contains(body, `"poison":true`) }

// eventIDOf reads a message's event ID as the consumer does.
func eventIDOf(m types.Message) string {
	id, _ := sqsdedup.Messages("").EventID(m)
	return id
}

func stringAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// sendBatch sends msgs (at most 10) with their event-id attributes.
func sendBatch(ctx context.Context, c *sqs.Client, url string, msgs []event) error {
	entries := make([]types.SendMessageBatchRequestEntry, len(msgs))
	for i, e := range msgs {
		entries[i] = types.SendMessageBatchRequestEntry{
			Id: aws.String(strconv.Itoa(i)), MessageBody: aws.String(e.body),
			MessageAttributes: map[string]types.MessageAttributeValue{"event-id": stringAttr(e.id)},
		}
	}
	out, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	if err != nil {
		return err
	}
	if len(out.Failed) > 0 {
		return fmt.Errorf("send: %d entries failed: %s", len(out.Failed), aws.ToString(out.Failed[0].Message))
	}
	return nil
}

// produceOver sends msgs in batches of 10 spread over about d, and reports
// the first error (or nil) on the channel when done.
func produceOver(c *sqs.Client, url string, msgs []event, d time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		batches := (len(msgs) + 9) / 10
		gap := d / time.Duration(max(batches, 1))
		start := time.Now()
		for b := 0; b < batches; b++ {
			if wait := time.Until(start.Add(time.Duration(b) * gap)); wait > 0 {
				time.Sleep(wait)
			}
			if err := sendBatch(context.Background(), c, url, msgs[b*10:min(b*10+10, len(msgs))]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// queueCounts returns the approximate visible, in-flight and delayed
// message counts of url. fauxqs's counts are exact.
func queueCounts(c *sqs.Client, url string) (visible, inFlight, delayed int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url),
		AttributeNames: []types.QueueAttributeName{
			types.QueueAttributeNameApproximateNumberOfMessages,
			types.QueueAttributeNameApproximateNumberOfMessagesNotVisible,
			types.QueueAttributeNameApproximateNumberOfMessagesDelayed,
		},
	})
	if err != nil {
		return 0, 0, 0, err
	}
	n := func(a types.QueueAttributeName) int { v, _ := strconv.Atoi(out.Attributes[string(a)]); return v }
	return n(types.QueueAttributeNameApproximateNumberOfMessages),
		n(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible),
		n(types.QueueAttributeNameApproximateNumberOfMessagesDelayed), nil
}

// queueTotal returns how many messages url holds, visible or not.
func queueTotal(t *testing.T, c *sqs.Client, url string) int {
	t.Helper()
	v, f, d, err := queueCounts(c, url)
	if err != nil {
		t.Fatalf("queue counts of %s: %v", url, err)
	}
	return v + f + d
}

// drainDLQ receives and deletes every message of url until a receive comes
// back empty and the queue counts none, and returns them: an emulator under
// load, like SQS itself, may answer a receive with nothing while messages
// wait. It gives up, returning what it got, once receives brought nothing
// for crashtest.Stall while the queue still counts messages.
func drainDLQ(t *testing.T, c *sqs.Client, url string) []types.Message {
	t.Helper()
	var all []types.Message
	giveUp := time.Now().Add(crashtest.Stall)
	for {
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 60,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			//lint:ignore SA1019 some SQS-compatible endpoints read only the older parameter
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll},
		}, sqsbody.KeepConnection)
		if err != nil {
			t.Fatalf("receive from %s: %v", url, err)
		}
		if len(out.Messages) == 0 {
			if queueTotal(t, c, url) == 0 || time.Now().After(giveUp) {
				return all
			}
			continue
		}
		entries := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
		for i, m := range out.Messages {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
		}
		if _, err := c.DeleteMessageBatch(context.Background(), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: entries}); err != nil {
			t.Fatalf("delete from %s: %v", url, err)
		}
		all = append(all, out.Messages...)
		giveUp = time.Now().Add(crashtest.Stall)
	}
}

// effectsTable creates a table of handler starts and effects, without any
// unique constraint so that an effect applied twice is two rows, and drops it
// when t ends.
func effectsTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := "sqsrel_effects_" + runID()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (
		event_id text NOT NULL, worker text NOT NULL, kind text NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	return table
}

// row is one start or effect a handler recorded.
type row struct{ worker, kind string }

// readRows returns, per event, its rows in the order they were written.
func readRows(t *testing.T, pool *pgxpool.Pool, table string) map[string][]row {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, worker, kind FROM `+table+` ORDER BY at`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]row{}
	var id string
	var r row
	_, err = pgx.ForEachRow(rows, []any{&id, &r.worker, &r.kind}, func() error {
		out[id] = append(out[id], r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// countEffects returns how many distinct events have an effect row.
func countEffects(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(DISTINCT event_id) FROM `+table+` WHERE kind = 'effect'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// dynamoDBTable creates a dedup table on client, deleted when t ends.
func dynamoDBTable(t *testing.T, client *dynamodb.Client) string {
	t.Helper()
	table := "sqsrel-" + runID()
	if err := dedup.CreateDynamoDBTable(context.Background(), client, dedup.WithTable(table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = client.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	return table
}

// letters indexes dead letters by event ID, checking that each carries
// readable metadata.
func letters(t *testing.T, dlq []types.Message) map[string][]map[string]string {
	t.Helper()
	out := map[string][]map[string]string{}
	for _, m := range dlq {
		meta, err := sqsdedup.DeadLetterMetadata(m)
		if err != nil {
			t.Errorf("dead letter %s: %v", aws.ToString(m.MessageId), err)
			continue
		}
		id := meta["dedup-event-id"]
		if got := aws.ToString(m.MessageAttributes["event-id"].StringValue); got != id {
			t.Errorf("dead letter of %s lost its event-id attribute (%q)", id, got)
		}
		out[id] = append(out[id], meta)
	}
	return out
}
