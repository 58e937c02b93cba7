package outbox_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/testenv"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/sqsoutbox"
)

// refusedCase is one Add of events of which one, labelled "big", is too
// large for the broker; the others carry their label as payload.
type refusedCase struct {
	name   string
	events [][2]string // label, key ("" for none)
}

var refusedCases = []refusedCase{
	{"one key", [][2]string{{"k1", "k"}, {"big", "k"}, {"k2", "k"}, {"k3", "k"}}},
	{"several keys", [][2]string{
		{"a1", "a"}, {"b1", "b"}, {"c1", "c"}, {"big", "a"}, {"a2", "a"}, {"b2", "b"},
		{"n1", ""}, {"c2", "c"}, {"a3", "a"}, {"b3", "b"},
	}},
}

// addRefusedCase writes c's events in one transaction, big with payload big
// and the others with their label as payload, and returns the label of each
// event ID.
func addRefusedCase(e *env, c refusedCase, dest string, big []byte) map[string]string {
	e.t.Helper()
	var events []outbox.Event
	for _, ev := range c.events {
		payload := []byte(ev[0])
		if ev[0] == "big" {
			payload = big
		}
		events = append(events, outbox.Event{Destination: dest, Key: []byte(ev[1]), Payload: payload})
	}
	labels := map[string]string{}
	for i, id := range e.add(true, events...) {
		labels[id] = c.events[i][0]
	}
	return labels
}

// wantPerKey returns the labels of c's events other than big, by key.
func wantPerKey(c refusedCase) map[string][]string {
	want := map[string][]string{}
	for _, ev := range c.events {
		if ev[0] != "big" {
			want[ev[1]] = append(want[ev[1]], ev[0])
		}
	}
	return want
}

// requireOnlyBigFailed waits until every event of c is settled and requires
// the big one failed at its first attempt, with a reason containing each of
// reasons, and the others sent.
func requireOnlyBigFailed(t *testing.T, e *env, c refusedCase, labels map[string]string, reasons ...string) {
	t.Helper()
	waitFor(t, 30*time.Second, "every event sent or failed", func() bool {
		s := e.statuses()
		return s["sent"]+s["failed"] == len(c.events)
	})
	require.Equal(t, map[string]int{"sent": len(c.events) - 1, "failed": 1}, e.statuses())
	failed, err := e.ob.Failed(context.Background(), e.pool, 10)
	require.NoError(t, err)
	require.Len(t, failed, 1)
	require.Equal(t, "big", labels[failed[0].ID])
	require.Equal(t, 1, failed[0].Attempts, "refused for good on its own at once")
	for _, r := range reasons {
		require.Contains(t, failed[0].LastError, r)
	}
	t.Logf("reason: %s", failed[0].LastError)
}

// TestKafkaRecordRefusedWithItsBatchFailsAlone: a broker refusing a record
// batch for one record in it (MESSAGE_TOO_LARGE on a topic whose
// max.message.bytes the record exceeds even compressed) fails that record
// alone, and the others of the batch are published in their key's order.
func TestKafkaRecordRefusedWithItsBatchFailsAlone(t *testing.T) {
	big := make([]byte, 100<<10) // random, so that compression cannot bring it under the limit
	_, _ = rand.Read(big)
	for _, c := range refusedCases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, 1)
			e.topic = "limited-" + runID()
			require.NoError(t, e.kafka.CreateTopic(e.topic, 3, map[string]string{"max.message.bytes": "65536"}))
			labels := addRefusedCase(e, c, e.topic, big)
			e.start(e.relay())

			requireOnlyBigFailed(t, e, c, labels, "MESSAGE_TOO_LARGE", "bytes")
			recs := e.consume(len(c.events)-1, 20*time.Second)
			got := map[string][]string{}
			for _, r := range recs {
				got[string(r.Key)] = append(got[string(r.Key)], labels[header(r, "event-id")])
			}
			require.Equal(t, wantPerKey(c), got, "each event but the big one, once, in its key's order")
		})
	}
}

// TestSQSEntryRefusedWithItsCallFailsAlone: SQS refusing a whole
// SendMessageBatch call for one entry in it (BatchRequestTooLong: a publisher
// allowed messages larger than SQS takes, and one came) fails that entry
// alone, and the others of the call are sent, a FIFO group's in order.
func TestSQSEntryRefusedWithItsCallFailsAlone(t *testing.T) {
	client := testenv.SQS(t)
	big := []byte(strings.Repeat("x", 1536<<10)) // over SQS's 1 MiB per call, under the publisher's limit
	for _, fifo := range []bool{false, true} {
		for _, c := range refusedCases {
			name, attrs := "standard/"+c.name, map[string]string(nil)
			if fifo {
				name, attrs = "FIFO/"+c.name, map[string]string{"FifoQueue": "true"}
			}
			t.Run(name, func(t *testing.T) {
				e := newEnv(t, 1)
				url := testenv.SQSQueue(t, client, attrs)
				labels := addRefusedCase(e, c, url, big)
				pub, err := sqsoutbox.NewPublisher(client, sqsoutbox.WithMaxMessageBytes(2<<20))
				require.NoError(t, err)
				r, err := outbox.NewRelay(e.ob, e.pool.Config(), pub,
					outbox.WithPollInterval(50*time.Millisecond), outbox.WithLogger(quietLogger()),
					outbox.WithBackoff(dedup.ExponentialBackoff(20*time.Millisecond, 100*time.Millisecond)))
				require.NoError(t, err)
				e.start(r)

				requireOnlyBigFailed(t, e, c, labels, "BatchRequestTooLong", "bytes")
				keys := map[string]string{}
				for _, ev := range c.events {
					keys[ev[0]] = ev[1]
				}
				got, all := map[string][]string{}, []string(nil)
				for _, m := range receiveAll(t, client, url, len(c.events)-1, 20*time.Second) {
					id, err := sqsdedup.Messages(url).EventID(m)
					require.NoError(t, err)
					label := labels[id]
					got[keys[label]] = append(got[keys[label]], label)
					all = append(all, label)
				}
				want := wantPerKey(c)
				if !fifo { // no groups, no order
					var wantAll []string
					for _, labels := range want {
						wantAll = append(wantAll, labels...)
					}
					require.ElementsMatch(t, wantAll, all, "each event but the big one, once")
					return
				}
				require.Equal(t, want, got, "each event but the big one, once, a group's in order")
			})
		}
	}
}
