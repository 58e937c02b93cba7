package awsfault_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/dedupkit/dedup/internal/awsfault"
	"github.com/dedupkit/dedup/internal/testenv"
)

var errBoom = errors.New("boom")

func withFault(t *testing.T, f *awsfault.Fault) *sqs.Client {
	return sqs.New(testenv.SQS(t).Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, f.APIOption) })
}

func listQueues(ctx context.Context, c *sqs.Client) error {
	_, err := c.ListQueues(ctx, &sqs.ListQueuesInput{})
	return err
}

func TestFailTimesOnlyNamedOperations(t *testing.T) {
	f := awsfault.Fail(errBoom, "ListQueues")
	c := withFault(t, f)
	ctx := context.Background()
	if err := listQueues(ctx, c); err != nil {
		t.Fatalf("a fault not switched on failed a call: %v", err)
	}
	f.Times(2)
	for i := range 2 {
		if err := listQueues(ctx, c); !errors.Is(err, errBoom) {
			t.Errorf("call %d: %v, want the injected error", i, err)
		}
	}
	if err := listQueues(ctx, c); err != nil {
		t.Errorf("third call: %v, want success", err)
	}
	f.On()
	if _, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: new(string)}); errors.Is(err, errBoom) {
		t.Errorf("an operation not named was failed: %v", err)
	}
	if err := listQueues(ctx, c); !errors.Is(err, errBoom) {
		t.Errorf("after On: %v, want the injected error", err)
	}
	f.Off()
	if err := listQueues(ctx, c); err != nil {
		t.Errorf("after Off: %v", err)
	}
	if f.Hits() != 3 {
		t.Errorf("Hits = %d, want 3", f.Hits())
	}
}

func TestDelay(t *testing.T) {
	f := awsfault.Delay(200 * time.Millisecond)
	c := withFault(t, f)
	f.On()
	begin := time.Now()
	if err := listQueues(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(begin); d < 200*time.Millisecond {
		t.Errorf("call took %v, want at least the 200ms delay", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := listQueues(ctx, c); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call whose context ends during the delay: %v, want DeadlineExceeded", err)
	}
}
