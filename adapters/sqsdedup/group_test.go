package sqsdedup_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// groupOfThree sends three messages to a new queue with a 30 s visibility
// timeout and receives them, as one receive of a FIFO group would hold them.
func groupOfThree(t *testing.T) (url string, msgs []types.Message) {
	c := client(t)
	url = testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "30"})
	for i := 1; i <= 3; i++ {
		send(t, c, url, "m"+strconv.Itoa(i), "body", nil)
	}
	for len(msgs) < 3 {
		got := receive(t, c, url, time.Second)
		if len(got) == 0 {
			t.Fatalf("received %d of 3 messages", len(msgs))
		}
		msgs = append(msgs, got...)
	}
	slices.SortFunc(msgs, func(a, b types.Message) int { return strings.Compare(eventID(a), eventID(b)) })
	return url, msgs
}

// visibleIDs receives what is visible in url and returns its event IDs.
func visibleIDs(t *testing.T, url string) []string {
	var ids []string
	for _, m := range receive(t, client(t), url, time.Second) {
		ids = append(ids, eventID(m))
	}
	slices.Sort(ids)
	return ids
}

// A message of a group that does not settle holds back the rest: they are
// not run, and are given back at once while it waits for its backoff.
func TestGroupHeldBackBehindFailure(t *testing.T) {
	t.Parallel()
	url, msgs := groupOfThree(t)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		rec.Call(eventID(m))
		if eventID(m) == "m2" {
			return errors.New("fails")
		}
		return nil
	}, dedup.WithBackoff(func(int) time.Duration { return time.Minute }))
	consumer, err := sqsdedup.NewConsumer(client(t), url, w)
	if err != nil {
		t.Fatal(err)
	}
	sqsdedup.HandleGroup(consumer, context.Background(), 30*time.Second, msgs)
	if got := rec.CallOrder(); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("handler calls %v, want [m1 m2]", got)
	}
	// m1 is deleted, m2 waits for its backoff, m3 is back.
	if got := visibleIDs(t, url); !slices.Equal(got, []string{"m3"}) {
		t.Errorf("visible after the group: %v, want [m3]", got)
	}
}

// Once Run's context is done, the message being handled finishes and the
// rest of its group is given back unstarted.
func TestGroupGivenBackAtShutdown(t *testing.T) {
	t.Parallel()
	url, msgs := groupOfThree(t)
	rec := adaptertest.NewEffects()
	stop, cancel := context.WithCancel(context.Background())
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(ctx context.Context, m types.Message) error {
		rec.Call(eventID(m))
		cancel() // shutdown begins while m1 runs
		return nil
	})
	consumer, err := sqsdedup.NewConsumer(client(t), url, w)
	if err != nil {
		t.Fatal(err)
	}
	sqsdedup.HandleGroup(consumer, stop, 30*time.Second, msgs)
	if got := rec.CallOrder(); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("handler calls %v, want [m1]", got)
	}
	if got := visibleIDs(t, url); !slices.Equal(got, []string{"m2", "m3"}) {
		t.Errorf("visible after shutdown: %v, want [m2 m3]", got)
	}
	if rec.Outcomes(dedup.OutcomeProcessed) != 1 {
		t.Errorf("m1 not processed: %d processed, calls %v", rec.Outcomes(dedup.OutcomeProcessed), rec.CallOrder())
	}
}
