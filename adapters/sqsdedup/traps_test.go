package sqsdedup_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// wantConfigError fails t unless err matches dedup.ErrConfig and names
// every one of names.
func wantConfigError(t *testing.T, err error, names ...string) {
	t.Helper()
	if !errors.Is(err, dedup.ErrConfig) {
		t.Fatalf("error %v, want one matching dedup.ErrConfig", err)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not name %s", err, n)
		}
	}
}

func noop(context.Context, types.Message) error { return nil }

// The queue is given twice, to Messages and to NewConsumer: another URL
// in each is refused, naming both, as letters would carry the wrong origin.
// A wrapper whose DeadLetter is the caller's own and names no queue passes.
func TestNewConsumerRefusesAnotherQueue(t *testing.T) {
	c := sqs.New(sqs.Options{Region: "us-east-1"})
	const consumed = "https://sqs.us-east-1.amazonaws.com/123456789012/payments"
	const other = "https://sqs.us-east-1.amazonaws.com/123456789012/refunds"
	w := wrap(t, dedup.NewMemoryStore(), other, adaptertest.NewEffects(), noop)
	_, err := sqsdedup.NewConsumer(c, consumed, w)
	wantConfigError(t, err, `"`+consumed+`"`, `"`+other+`"`)

	if _, err := sqsdedup.NewConsumer(c, consumed, wrap(t, dedup.NewMemoryStore(), consumed, adaptertest.NewEffects(), noop)); err != nil {
		t.Errorf("the same URL: %v", err)
	}
	own := sqsdedup.Messages(consumed)
	own.DeadLetter = func(m types.Message) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(*m.Body)} } // panics on no body
	w, err = dedup.Wrap(dedup.NewMemoryStore(), own, noop, dedup.WithScope(uniqueScope()), dedup.WithSink(dedup.NewMemorySink()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqsdedup.NewConsumer(c, consumed, w); err != nil {
		t.Errorf("a DeadLetter of one's own: %v", err)
	}
}

// A visibility timeout longer than the wrapper's TTL, the lease of every
// call unless the wrapper has WithLease, is refused with ErrConfig naming
// both: WithVisibilityTimeout by NewConsumer, the queue's own by Run.
func TestVisibilityTimeoutOverTTLIsRefused(t *testing.T) {
	c := testenv.SQS(t)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "60"})
	newWrapper := func(opts ...dedup.Opt) *dedup.Wrapper[types.Message] {
		w, err := dedup.Wrap(dedup.NewMemoryStore(), sqsdedup.Messages(url), noop,
			append([]dedup.Opt{dedup.WithScope(uniqueScope()), dedup.WithSink(dedup.NewMemorySink())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}

	_, err := sqsdedup.NewConsumer(c, url, newWrapper(dedup.WithTTL(45*time.Second)), sqsdedup.WithVisibilityTimeout(50*time.Second))
	wantConfigError(t, err, "WithTTL(45s)", "WithVisibilityTimeout(50s)")
	if _, err := sqsdedup.NewConsumer(c, url, newWrapper(dedup.WithTTL(45*time.Second), dedup.WithLease(40*time.Second)),
		sqsdedup.WithVisibilityTimeout(50*time.Second)); err != nil {
		t.Errorf("with WithLease under the TTL: %v", err)
	}

	consumer, err := sqsdedup.NewConsumer(c, url, newWrapper(dedup.WithTTL(45*time.Second)), sqsdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound on a hang, not on the answer
	defer cancel()
	wantConfigError(t, consumer.Run(ctx), "WithTTL(45s)", "the visibility timeout of "+url+", 1m0s")
}
