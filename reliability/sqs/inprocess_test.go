package sqsreliability_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go/middleware"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// withAPIOptions returns a copy of client with more API options.
func withAPIOptions(client *sqs.Client, opts ...func(*middleware.Stack) error) *sqs.Client {
	return sqs.New(client.Options(), func(o *sqs.Options) { o.APIOptions = append(o.APIOptions, opts...) })
}

// deleteLog records, through an SQS client's middleware, every message the
// client deleted: its event ID and when the delete was sent.
type deleteLog struct {
	mu      sync.Mutex
	events  map[string]string // receipt handle -> event ID, from receives
	deletes []deletion
}

type deletion struct {
	eventID string
	at      time.Time
}

func newDeleteLog() *deleteLog { return &deleteLog{events: map[string]string{}} }

// APIOption adds the log to a client's middleware stack.
func (l *deleteLog) APIOption(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("deleteLog",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			sent := time.Now()
			out, md, err := next.HandleInitialize(ctx, in)
			if err != nil {
				return out, md, err
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			switch res := out.Result.(type) {
			case *sqs.ReceiveMessageOutput:
				for _, m := range res.Messages {
					l.events[aws.ToString(m.ReceiptHandle)] = eventIDOf(m)
				}
			case *sqs.DeleteMessageBatchOutput:
				entries := in.Parameters.(*sqs.DeleteMessageBatchInput).Entries
				for _, ok := range res.Successful {
					for _, e := range entries {
						if aws.ToString(e.Id) == aws.ToString(ok.Id) {
							l.deletes = append(l.deletes, deletion{l.events[aws.ToString(e.ReceiptHandle)], sent})
						}
					}
				}
			}
			return out, md, err
		}), middleware.Before)
}

func (l *deleteLog) deleted() []deletion {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]deletion(nil), l.deletes...)
}

// checkDeletesSettled fails t unless every deleted message's event was
// recorded as settled (succeeded or failed for good) before the delete was
// sent: nothing is deleted that was not settled.
func checkDeletesSettled(t *testing.T, store dedup.Store, scope string, log *deleteLog) {
	t.Helper()
	for _, d := range log.deleted() {
		rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: d.eventID})
		switch {
		case err != nil:
			t.Errorf("deleted a message of %q, whose record cannot be read: %v", d.eventID, err)
		case rec.Status != dedup.StatusSucceeded && rec.Status != dedup.StatusFailedFinal:
			t.Errorf("deleted a message of %q, whose record is %s", d.eventID, rec.Status)
		case rec.UpdatedAt.After(d.at):
			t.Errorf("deleted a message of %q at %v, before its record settled at %v", d.eventID, d.at, rec.UpdatedAt)
		}
	}
}

// effects counts, in process, the handler runs and effects of each event.
type effects struct {
	mu      sync.Mutex
	runs    map[string]int
	applied map[string]int
}

func newEffects() *effects { return &effects{runs: map[string]int{}, applied: map[string]int{}} }

// handler runs a little while, then fails for a poison event or applies
// the effect.
func (e *effects) handler(ctx context.Context, m types.Message) error {
	id := eventIDOf(m)
	e.mu.Lock()
	e.runs[id]++
	e.mu.Unlock()
	time.Sleep(rand.N(10 * time.Millisecond))
	if isPoison(aws.ToString(m.Body)) {
		return errPoison
	}
	e.mu.Lock()
	e.applied[id]++
	e.mu.Unlock()
	return nil
}

func (e *effects) distinct() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.applied)
}

func (e *effects) of(id string) (runs, applied int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[id], e.applied[id]
}

// logRecords keeps the log records of the consumers and wrappers, so that
// a test can look for the errors they reported.
type logRecords struct {
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	msg   string
	key   string
	err   error
	attrs map[string]string
}

func (l *logRecords) logger() *slog.Logger { return slog.New(logHandler{l, nil}) }

// len returns how many records were logged: a consumer that retries logs
// as it goes, a measure of progress for crashtest.Await.
func (l *logRecords) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.records)
}

// errors returns the errors logged with the records whose message is msg.
func (l *logRecords) errors(msg string) []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs []error
	for _, r := range l.records {
		if r.msg == msg && r.err != nil {
			errs = append(errs, r.err)
		}
	}
	return errs
}

// keys returns the keys of the records whose message is msg and whose error
// matches is.
func (l *logRecords) keys(msg string, is func(error) bool) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := map[string]bool{}
	for _, r := range l.records {
		if r.msg == msg && r.err != nil && is(r.err) {
			keys[r.key] = true
		}
	}
	return keys
}

func (l *logRecords) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := ""
	for i, r := range l.records {
		if i == 40 {
			return s + fmt.Sprintf("... and %d more\n", len(l.records)-40)
		}
		s += fmt.Sprintf("%s key=%s error=%v %v\n", r.msg, r.key, r.err, r.attrs)
	}
	return s
}

type logHandler struct {
	l     *logRecords
	attrs []slog.Attr
}

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{msg: r.Message, attrs: map[string]string{}}
	add := func(a slog.Attr) bool {
		switch v := a.Value.Any().(type) {
		case error:
			if a.Key == "error" {
				rec.err = v
			}
		}
		if a.Key == "key" {
			rec.key = a.Value.String()
		}
		rec.attrs[a.Key] = a.Value.String()
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.l.mu.Lock()
	h.l.records = append(h.l.records, rec)
	h.l.mu.Unlock()
	return nil
}

func (h logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{h.l, append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h logHandler) WithGroup(string) slog.Handler { return h }

// runConsumer runs an sqsdedup.Consumer until the returned stop is called
// (or t ends); stop waits for Run and fails t if it returned an error.
func runConsumer(t *testing.T, c *sqs.Client, url string, w *dedup.Wrapper[types.Message], opts ...sqsdedup.Opt) (stop func()) {
	t.Helper()
	base := []sqsdedup.Opt{sqsdedup.WithWaitTime(time.Second), sqsdedup.WithInFlightDelay(time.Second),
		sqsdedup.WithShutdownTimeout(5 * time.Second)}
	consumer, err := sqsdedup.NewConsumer(c, url, w, append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(crashtest.Stall):
				t.Errorf("Run did not return within %v of cancellation", crashtest.Stall)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
