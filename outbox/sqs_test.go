package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/awsfault"
	"github.com/dedupkit/dedup/internal/sqsbody"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/sqsoutbox"
)

// sqsRelay returns a relay of e's outbox publishing to SQS through a client
// carrying fault.
func sqsRelay(t *testing.T, e *env, client *sqs.Client, fault *awsfault.Fault, opts ...outbox.RelayOpt) *outbox.Relay {
	t.Helper()
	if fault != nil {
		client = sqs.New(client.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, fault.APIOption) })
	}
	pub, err := sqsoutbox.NewPublisher(client)
	require.NoError(t, err)
	r, err := outbox.NewRelay(e.ob, e.pool.Config(), pub, append([]outbox.RelayOpt{
		outbox.WithPollInterval(50 * time.Millisecond),
		outbox.WithBackoff(dedup.ExponentialBackoff(20*time.Millisecond, 100*time.Millisecond)),
		outbox.WithLogger(quietLogger()),
	}, opts...)...)
	require.NoError(t, err)
	return r
}

// receiveAll receives from url until want messages arrived (deleting them)
// or within passed.
func receiveAll(t *testing.T, client *sqs.Client, url string, want int, within time.Duration) []types.Message {
	t.Helper()
	var got []types.Message
	deadline := time.Now().Add(within)
	for len(got) < want && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		// KeepConnection: an answer thrown away would hide its messages for
		// the queue's visibility timeout, longer than the test waits.
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		}, sqsbody.KeepConnection)
		cancel()
		require.NoError(t, err)
		for _, m := range out.Messages {
			got = append(got, m)
			_, err := client.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
	}
	return got
}

func TestSQSPublisherStandardAndFIFO(t *testing.T) {
	e := newEnv(t, 1)
	client := testenv.SQS(t)
	std := testenv.SQSQueue(t, client, nil)
	fifo := testenv.SQSQueue(t, client, map[string]string{"FifoQueue": "true"})
	fifoName := fifo[strings.LastIndex(fifo, "/")+1:]

	var stdIDs []string
	for i := range 23 {
		stdIDs = append(stdIDs, e.add(true, outbox.Event{Destination: std, Payload: []byte(fmt.Sprint("s", i)),
			Tenant: "acme", Headers: []outbox.Header{{Key: "trace", Value: []byte("t1")}}})...)
	}
	var fifoIDs []string
	for i := range 12 {
		fifoIDs = append(fifoIDs, e.add(true, outbox.Event{Destination: fifoName, Key: []byte(fmt.Sprint("g", i%2)), Payload: []byte(fmt.Sprint(i))})...)
	}
	e.add(false, outbox.Event{Destination: std, Payload: []byte("rolled back")})
	e.start(sqsRelay(t, e, client, nil), sqsRelay(t, e, client, nil))

	got := receiveAll(t, client, std, 23, 20*time.Second)
	msgs := sqsdedup.Messages(std)
	var ids []string
	for _, m := range got {
		id, err := msgs.EventID(m)
		require.NoError(t, err)
		ids = append(ids, id)
		require.Equal(t, "acme", aws.ToString(m.MessageAttributes["tenant"].StringValue))
		require.Equal(t, "t1", aws.ToString(m.MessageAttributes["trace"].StringValue))
	}
	require.ElementsMatch(t, stdIDs, ids, "each committed event once, the rolled-back one never")

	got = receiveAll(t, client, fifo, 12, 20*time.Second)
	perGroup := map[string][]string{}
	for _, m := range got {
		id, err := sqsdedup.Messages(fifo).EventID(m)
		require.NoError(t, err)
		require.Equal(t, id, m.Attributes[string(types.MessageSystemAttributeNameMessageDeduplicationId)])
		g := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		perGroup[g] = append(perGroup[g], id)
	}
	require.Equal(t, []string{fifoIDs[0], fifoIDs[2], fifoIDs[4], fifoIDs[6], fifoIDs[8], fifoIDs[10]}, perGroup["g0"])
	require.Equal(t, []string{fifoIDs[1], fifoIDs[3], fifoIDs[5], fifoIDs[7], fifoIDs[9], fifoIDs[11]}, perGroup["g1"])
	waitFor(t, 5*time.Second, "all sent", func() bool { return e.statuses()["sent"] == 35 })
}

func TestSQSUndeliverableEventsFail(t *testing.T) {
	e := newEnv(t, 1)
	client := testenv.SQS(t)
	std := testenv.SQSQueue(t, client, nil)
	fifo := testenv.SQSQueue(t, client, map[string]string{"FifoQueue": "true"})
	var manyHeaders []outbox.Header
	for i := range 10 {
		manyHeaders = append(manyHeaders, outbox.Header{Key: fmt.Sprint("h", i), Value: []byte("v")})
	}
	bad := map[string]outbox.Event{
		"binary payload":  {Destination: std, Payload: []byte{0xff, 0x00}},
		"oversized":       {Destination: std, Payload: []byte(strings.Repeat("x", sqsoutbox.DefaultMaxMessageBytes))},
		"missing queue":   {Destination: "no-such-queue-" + runID(), Payload: []byte("p")},
		"missing URL":     {Destination: strings.TrimSuffix(std, "/"+std[strings.LastIndex(std, "/")+1:]) + "/gone-" + runID(), Payload: []byte("p")},
		"11 attributes":   {Destination: std, Payload: []byte("p"), Headers: manyHeaders},
		"bad header name": {Destination: std, Payload: []byte("p"), Headers: []outbox.Header{{Key: "AWS.x", Value: []byte("v")}}},
		"bad FIFO group":  {Destination: fifo, Key: []byte("has space"), Payload: []byte("p")},
		"empty header":    {Destination: std, Payload: []byte("p"), Headers: []outbox.Header{{Key: "h", Value: nil}}},
	}
	reasons := map[string]string{}
	for name, ev := range bad {
		reasons[e.add(true, ev)[0]] = name
	}
	good := e.add(true, outbox.Event{Destination: std, Payload: []byte("fine")})
	e.start(sqsRelay(t, e, client, nil))

	waitFor(t, 20*time.Second, "the bad events failed", func() bool { return e.statuses()["failed"] == len(bad) })
	failed, err := e.ob.Failed(context.Background(), e.pool, 100)
	require.NoError(t, err)
	for _, f := range failed {
		require.Equal(t, 1, f.Attempts, "%s: failed at once, not retried", reasons[f.ID])
		require.NotEmpty(t, f.LastError, reasons[f.ID])
		t.Logf("%-16s %s", reasons[f.ID], f.LastError)
	}
	got := receiveAll(t, client, std, 1, 10*time.Second)
	require.Len(t, got, 1)
	id, err := sqsdedup.Messages(std).EventID(got[0])
	require.NoError(t, err)
	require.Equal(t, good[0], id)
}

func TestSQSFailingRequestsAreRetriedAndNothingIsLost(t *testing.T) {
	e := newEnv(t, 1)
	client := testenv.SQS(t)
	fifo := testenv.SQSQueue(t, client, map[string]string{"FifoQueue": "true"})
	fault := awsfault.Fail(errors.New("connection reset"), "SendMessageBatch")
	fault.On()
	var ids []string
	for i := range 15 {
		ids = append(ids, e.add(true, outbox.Event{Destination: fifo, Key: []byte(fmt.Sprint("g", i%3)), Payload: []byte(fmt.Sprint(i))})...)
	}
	e.start(sqsRelay(t, e, client, fault, outbox.WithMaxAttempts(1000)))
	waitFor(t, 10*time.Second, "several refused passes", func() bool { return fault.Hits() >= 5 })
	require.Equal(t, 15, e.statuses()["pending"])
	fault.Off()

	got := receiveAll(t, client, fifo, 15, 30*time.Second)
	perGroup := map[string][]string{}
	for _, m := range got {
		id, err := sqsdedup.Messages(fifo).EventID(m)
		require.NoError(t, err)
		g := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		perGroup[g] = append(perGroup[g], id)
	}
	for g := range 3 {
		var want []string
		for i := g; i < 15; i += 3 {
			want = append(want, ids[i])
		}
		require.Equal(t, want, perGroup[fmt.Sprint("g", g)], "group g%d in commit order, each once", g)
	}
}
