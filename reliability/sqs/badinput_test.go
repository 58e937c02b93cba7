package sqsreliability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// badEnv is what one bad-input case runs in: a queue, its DLQ, and the
// pieces of the consumer that a case may replace before it starts.
type badEnv struct {
	c        *sqs.Client
	url, dlq string
	scope    string
	store    dedup.Store
	ddb      *dynamodb.Client
	table    string
	sink     *sqs.Client // the DLQ's client
	sinkOpts []sqsdedup.SinkOpt
	msgs     dedup.Messages[types.Message]
	opts     []dedup.Opt
	eff      *effects
	logs     *logRecords
}

// send sends one message with body and attributes.
func (e *badEnv) send(t *testing.T, body string, attrs map[string]types.MessageAttributeValue) {
	t.Helper()
	_, err := e.c.SendMessage(context.Background(), &sqs.SendMessageInput{
		QueueUrl: aws.String(e.url), MessageBody: aws.String(body), MessageAttributes: attrs,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func idAttr(id string) map[string]types.MessageAttributeValue {
	return map[string]types.MessageAttributeValue{"event-id": stringAttr(id)}
}

// poisonBody is a body the handler fails on; MaxAttempts is 1 here, so it
// is dead-lettered at its first failure.
const poisonBody = `{"poison":true}`

// closedDynamoDB returns a DynamoDB client of a port where nothing listens,
// without retries.
func closedDynamoDB(t *testing.T) *dynamodb.Client {
	return dynamodb.New(dynamoDBClient("http://"+testenv.ClosedPort(t)).Options(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
}

func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// TestBadInput sends every input of DESIGN §9 that applies to SQS through
// an sqsdedup.Consumer over the DynamoDB store, and checks its documented
// outcome: a dead letter with its reason (the original deleted), or a typed
// error reported while the original stays in its queue. Never a panic,
// never a silent delete.
func TestBadInput(t *testing.T) {
	ddb := testenv.DynamoDB(t)
	table := dynamoDBTable(t, ddb)
	longID := strings.Repeat("x", dedup.MaxIDLen+1)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, e *badEnv)
		send  func(t *testing.T, e *badEnv)
		// Dead-lettered: the reason, and a text the letter's error contains.
		reason  dedup.Reason
		errText string
		applied int // effects expected
		// Left in the queue: the error reported, again at each delivery.
		stays func(error) bool
	}{
		{
			name:   "missing event-id attribute",
			send:   func(t *testing.T, e *badEnv) { e.send(t, "no id", nil) },
			reason: dedup.ReasonInvalidID, errText: sqsdedup.ErrNoEventID.Error(),
		},
		{
			name: "empty event ID",
			// SQS refuses empty attribute values; an ID read from the body
			// can be empty.
			setup: func(t *testing.T, e *badEnv) {
				e.msgs.EventID = func(m types.Message) (string, error) {
					var body struct{ ID string }
					err := json.Unmarshal([]byte(aws.ToString(m.Body)), &body)
					return body.ID, err
				}
			},
			send:   func(t *testing.T, e *badEnv) { e.send(t, `{"id":""}`, nil) },
			reason: dedup.ReasonInvalidID, errText: "event ID is empty",
		},
		{
			name:   "event ID over 255 bytes",
			send:   func(t *testing.T, e *badEnv) { e.send(t, "long id", idAttr(longID)) },
			reason: dedup.ReasonInvalidID, errText: "over 255",
		},
		{
			name:   "event ID with a control character",
			send:   func(t *testing.T, e *badEnv) { e.send(t, "tab", idAttr("evt\t1")) },
			reason: dedup.ReasonInvalidID, errText: "control character U+0009",
		},
		{
			name: "binary event ID with a NUL byte",
			send: func(t *testing.T, e *badEnv) {
				e.send(t, "nul", map[string]types.MessageAttributeValue{
					"event-id": {DataType: aws.String("Binary"), BinaryValue: []byte("evt\x001")},
				})
			},
			reason: dedup.ReasonInvalidID, errText: "control character U+0000",
		},
		{
			name: "tenant missing",
			setup: func(t *testing.T, e *badEnv) {
				e.msgs.Tenant = func(m types.Message) (string, error) {
					if v, ok := m.MessageAttributes["tenant"]; ok {
						return aws.ToString(v.StringValue), nil
					}
					return "", errors.New("no tenant attribute")
				}
			},
			send:   func(t *testing.T, e *badEnv) { e.send(t, "no tenant", idAttr("evt-1")) },
			reason: dedup.ReasonInvalidID, errText: "no tenant attribute",
		},
		{
			name: "payload the JSON fingerprint cannot read",
			setup: func(t *testing.T, e *badEnv) {
				e.opts = append(e.opts, dedup.WithFingerprint(dedup.JSONFingerprint("v1", "amount")))
			},
			send:   func(t *testing.T, e *badEnv) { e.send(t, `{"amount": 10`, idAttr("evt-1")) },
			reason: dedup.ReasonInvalidPayload, errText: dedup.ErrInvalidPayload.Error(),
		},
		{
			name: "same event ID, other payload",
			send: func(t *testing.T, e *badEnv) {
				e.send(t, `{"amount":10}`, idAttr("evt-1"))
				e.send(t, `{"amount":99}`, idAttr("evt-1"))
			},
			reason: dedup.ReasonConflict, errText: dedup.ErrFingerprintConflict.Error(), applied: 1,
		},
		{
			name: "store unreachable",
			setup: func(t *testing.T, e *badEnv) {
				e.store = newDynamoDBStore(t, closedDynamoDB(t), e.table)
			},
			send:  func(t *testing.T, e *badEnv) { e.send(t, "x", idAttr("evt-1")) },
			stays: refused,
		},
		{
			name: "table missing",
			setup: func(t *testing.T, e *badEnv) {
				e.store = newDynamoDBStore(t, e.ddb, "sqsrel-missing-"+runID())
			},
			send: func(t *testing.T, e *badEnv) { e.send(t, "x", idAttr("evt-1")) },
			stays: func(err error) bool {
				var missing *ddbtypes.ResourceNotFoundException
				return errors.As(err, &missing)
			},
		},
		{
			name: "malformed record in the store",
			setup: func(t *testing.T, e *badEnv) {
				// The item of (scope, evt-1), as another writer might have
				// left it: an unknown status and no expiry.
				_, err := e.ddb.PutItem(context.Background(), &dynamodb.PutItemInput{
					TableName: aws.String(e.table),
					Item: map[string]ddbtypes.AttributeValue{
						"pk":     &ddbtypes.AttributeValueMemberS{Value: e.scope + "#evt-1"},
						"status": &ddbtypes.AttributeValueMemberS{Value: "DONE-ISH"},
					},
				})
				if err != nil {
					t.Fatal(err)
				}
			},
			send:  func(t *testing.T, e *badEnv) { e.send(t, "x", idAttr("evt-1")) },
			stays: func(err error) bool { return errors.Is(err, dedup.ErrMalformedRecord) },
		},
		{
			name:  "DLQ unreachable",
			setup: func(t *testing.T, e *badEnv) { e.sink = sqsClient("http://" + testenv.ClosedPort(t)) },
			send:  func(t *testing.T, e *badEnv) { e.send(t, poisonBody, idAttr("evt-1")) },
			stays: refused,
		},
		{
			name:  "payload too large for the DLQ",
			setup: func(t *testing.T, e *badEnv) { e.sinkOpts = []sqsdedup.SinkOpt{sqsdedup.WithMaxMessageSize(1024)} },
			send: func(t *testing.T, e *badEnv) {
				e.send(t, `{"poison":true,"pad":"`+strings.Repeat("p", 2000)+`"}`, idAttr("evt-1"))
			},
			stays: func(err error) bool {
				var tooLarge *sqsdedup.TooLargeError
				return errors.As(err, &tooLarge) && tooLarge.Limit == 1024
			},
		},
		{
			name: "original with 10 attributes",
			send: func(t *testing.T, e *badEnv) {
				attrs := idAttr("evt-1")
				for i := range 9 {
					attrs[fmt.Sprintf("attr-%d", i)] = stringAttr("v")
				}
				e.send(t, poisonBody, attrs)
			},
			stays: func(err error) bool { return errors.Is(err, sqsdedup.ErrTooManyAttributes) },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := testenv.SQS(t)
			// A message that stays must come back, so it is hidden for a
			// second; one that is dead-lettered must not come back before
			// its deletion, however late a loaded machine runs the
			// visibility heartbeat: a bad ID has no key to deduplicate
			// its letter by.
			visibility := "10"
			if tc.stays != nil {
				visibility = "1"
			}
			e := &badEnv{
				c: c, url: testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": visibility}), dlq: testenv.SQSQueue(t, c, nil),
				scope: "sqsrel-bad-" + runID(), ddb: ddb, table: table, sink: c,
				eff: newEffects(), logs: &logRecords{},
			}
			e.store = newDynamoDBStore(t, ddb, table)
			e.msgs = sqsdedup.Messages(e.url)
			if tc.setup != nil {
				tc.setup(t, e)
			}
			sink, err := sqsdedup.NewSink(e.sink, e.dlq, e.sinkOpts...)
			if err != nil {
				t.Fatal(err)
			}
			opts := append([]dedup.Opt{dedup.WithScope(e.scope), dedup.WithSink(sink), dedup.WithMaxAttempts(1),
				dedup.WithLogger(e.logs.logger())}, e.opts...)
			w, err := dedup.Wrap(e.store, e.msgs, e.eff.handler, opts...)
			if err != nil {
				t.Fatal(err)
			}
			tc.send(t, e)
			sent := queueTotal(t, c, e.url)
			stop := runConsumer(t, c, e.url, w, sqsdedup.WithLogger(e.logs.logger()))

			if tc.stays != nil {
				// Reported at two deliveries at least: the message came
				// back, so it was not deleted.
				reported := func() int { return len(matching(e.logs.errors(notAcked), tc.stays)) }
				crashtest.Await(t, "the expected error reported twice", func() bool { return reported() >= 2 }, reported, func() string {
					return "logged:\n" + e.logs.String()
				})
				stop()
				if n := queueTotal(t, c, e.url); n != sent {
					t.Errorf("the queue holds %d messages, want the %d sent", n, sent)
				}
				if n := queueTotal(t, c, e.dlq); n != 0 {
					t.Errorf("the DLQ holds %d messages", n)
				}
				if n := e.eff.distinct(); n != 0 {
					t.Errorf("%d effects applied", n)
				}
				return
			}

			crashtest.Await(t, "the queue drained", func() bool { return queueTotal(t, c, e.url) == 0 },
				func() int { return e.logs.len() - queueTotal(t, c, e.url) }, func() string {
					return fmt.Sprintf("%d messages in the queue; logged:\n%s", queueTotal(t, c, e.url), e.logs.String())
				})
			stop()
			dl := drainDLQ(t, c, e.dlq)
			if len(dl) != 1 {
				t.Fatalf("the DLQ holds %d letters, want 1", len(dl))
			}
			meta, err := sqsdedup.DeadLetterMetadata(dl[0])
			if err != nil {
				t.Fatal(err)
			}
			if meta["dedup-reason"] != string(tc.reason) || !strings.Contains(meta["dedup-error"], tc.errText) {
				t.Errorf("dead letter reason %q error %q, want %q containing %q", meta["dedup-reason"], meta["dedup-error"], tc.reason, tc.errText)
			}
			if meta["dedup-scope"] != e.scope || meta["dedup-origin-queue"] != e.url || meta["dedup-origin-message-id"] == "" {
				t.Errorf("dead letter metadata lacks its scope or origin: %v", meta)
			}
			if n := e.eff.distinct(); n != tc.applied {
				t.Errorf("%d effects applied, want %d", n, tc.applied)
			}
		})
	}
}

func newDynamoDBStore(t *testing.T, client *dynamodb.Client, table string) dedup.Store {
	t.Helper()
	s, err := dedup.NewDynamoDBStore(client, dedup.WithTable(table))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func matching(errs []error, is func(error) bool) []error {
	var out []error
	for _, err := range errs {
		if is(err) {
			out = append(out, err)
		}
	}
	return out
}

// A handler that returns nil after its context was cancelled (here by the
// consumer's shutdown timeout) is trusted: its effect may be done, so the
// event is recorded as processed and the message deleted, with a warning.
func TestBadInputNilAfterCancel(t *testing.T) {
	c := testenv.SQS(t)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "1"})
	ddb := testenv.DynamoDB(t)
	store := newDynamoDBStore(t, ddb, dynamoDBTable(t, ddb))
	logs := &logRecords{}
	started := make(chan struct{}, 1)
	applied := 0
	scope := "sqsrel-cancel-" + runID()
	w, err := dedup.Wrap(store, sqsdedup.Messages(url), func(ctx context.Context, m types.Message) error {
		started <- struct{}{}
		<-ctx.Done()
		applied++ // the handler finishes its work regardless
		return nil
	}, dedup.WithScope(scope), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.SendMessage(context.Background(), &sqs.SendMessageInput{
		QueueUrl: aws.String(url), MessageBody: aws.String("x"), MessageAttributes: idAttr("evt-1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	stop := runConsumer(t, c, url, w, sqsdedup.WithShutdownTimeout(300*time.Millisecond))
	select {
	case <-started:
	case <-time.After(crashtest.Stall):
		t.Fatalf("the handler did not start within %v", crashtest.Stall)
	}
	stop()
	if applied != 1 {
		t.Errorf("handler finished %d times", applied)
	}
	if n := queueTotal(t, c, url); n != 0 {
		t.Errorf("the queue holds %d messages, want the message deleted", n)
	}
	rec, err := store.Get(context.Background(), dedup.Key{Scope: scope, EventID: "evt-1"})
	if err != nil || rec.Status != dedup.StatusSucceeded {
		t.Errorf("record %+v, %v; want succeeded", rec, err)
	}
	if !strings.Contains(logs.String(), "handler returned nil after its context was cancelled") {
		t.Errorf("no warning logged:\n%s", logs)
	}
}

// The Lambda handler reports as batch item failures exactly the records
// that did not settle: bad IDs and conflicts are dead-lettered (settled),
// while an unreachable store or DLQ leaves the records to come back.
func TestBadInputLambda(t *testing.T) {
	const arn = "arn:aws:sqs:us-east-1:000000000000:orders"
	rec := func(id string, eventID *string, body string) events.SQSMessage {
		m := events.SQSMessage{MessageId: id, Body: body, EventSourceARN: arn,
			Attributes: map[string]string{"ApproximateReceiveCount": "1"}}
		if eventID != nil {
			m.MessageAttributes = map[string]events.SQSMessageAttribute{"event-id": {DataType: "String", StringValue: eventID}}
		}
		return m
	}
	ptr := func(s string) *string { return &s }
	ddb := testenv.DynamoDB(t)
	table := dynamoDBTable(t, ddb)
	wrapper := func(t *testing.T, store dedup.Store, sink dedup.Sink, h dedup.Handler[events.SQSMessage]) *dedup.Wrapper[events.SQSMessage] {
		t.Helper()
		w, err := dedup.Wrap(store, sqsdedup.LambdaMessages(), h,
			dedup.WithScope("sqsrel-lambda-"+runID()), dedup.WithSink(sink), dedup.WithMaxAttempts(1))
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	applied := map[string]int{}
	handler := func(ctx context.Context, m events.SQSMessage) error {
		if isPoison(m.Body) {
			return errPoison
		}
		applied[m.MessageId]++
		return nil
	}
	failures := func(resp events.SQSEventResponse) []string {
		var ids []string
		for _, f := range resp.BatchItemFailures {
			ids = append(ids, f.ItemIdentifier)
		}
		return ids
	}

	t.Run("bad records settle as dead letters", func(t *testing.T) {
		sink := dedup.NewMemorySink()
		h := sqsdedup.LambdaHandler(wrapper(t, newDynamoDBStore(t, ddb, table), sink, handler))
		resp, err := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
			rec("m-missing", nil, "x"),
			rec("m-empty", ptr(""), "x"),
			rec("m-control", ptr("evt\x07"), "x"),
			{}, // a zero record
			rec("m-first", ptr("evt-1"), `{"amount":10}`),
			rec("m-conflict", ptr("evt-1"), `{"amount":99}`),
			rec("m-poison", ptr("evt-2"), poisonBody),
		}})
		if err != nil {
			t.Fatal(err)
		}
		if got := failures(resp); len(got) != 0 {
			t.Errorf("batch item failures %v, want none", got)
		}
		reasons := map[string]dedup.Reason{}
		for _, dl := range sink.Letters() {
			reasons[dl.Origin.MessageID] = dl.Reason
		}
		want := map[string]dedup.Reason{"m-missing": dedup.ReasonInvalidID, "m-empty": dedup.ReasonInvalidID,
			"m-control": dedup.ReasonInvalidID, "": dedup.ReasonInvalidID, "m-conflict": dedup.ReasonConflict,
			"m-poison": dedup.ReasonHandlerError}
		if fmt.Sprint(reasons) != fmt.Sprint(want) {
			t.Errorf("dead letters %v, want %v", reasons, want)
		}
		if applied["m-first"] != 1 || len(applied) != 1 {
			t.Errorf("effects %v, want m-first once", applied)
		}
	})

	t.Run("store unreachable fails every record", func(t *testing.T) {
		h := sqsdedup.LambdaHandler(wrapper(t, newDynamoDBStore(t, closedDynamoDB(t), table), dedup.NewMemorySink(), handler))
		resp, _ := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
			rec("m1", ptr("evt-1"), "a"), rec("m2", ptr("evt-2"), "b"),
		}})
		if got := failures(resp); fmt.Sprint(got) != "[m1 m2]" {
			t.Errorf("batch item failures %v, want [m1 m2]", got)
		}
	})

	t.Run("DLQ unreachable fails the records to park", func(t *testing.T) {
		sink, err := sqsdedup.NewSink(sqsClient("http://"+testenv.ClosedPort(t)), "http://"+testenv.ClosedPort(t)+"/000000000000/dlq")
		if err != nil {
			t.Fatal(err)
		}
		clear(applied)
		h := sqsdedup.LambdaHandler(wrapper(t, newDynamoDBStore(t, ddb, table), sink, handler))
		resp, _ := h(context.Background(), events.SQSEvent{Records: []events.SQSMessage{
			rec("m-good", ptr("evt-1"), "a"), rec("m-poison", ptr("evt-2"), poisonBody), rec("m-missing", nil, "c"),
		}})
		if got := failures(resp); fmt.Sprint(got) != "[m-poison m-missing]" {
			t.Errorf("batch item failures %v, want [m-poison m-missing]", got)
		}
		if applied["m-good"] != 1 {
			t.Errorf("effects %v, want m-good once", applied)
		}
	})

	t.Run("nil after the deadline is trusted", func(t *testing.T) {
		clear(applied)
		// The invocation's context ends while the handler runs: however
		// long the claim took on a loaded machine, the handler has begun.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		h := sqsdedup.LambdaHandler(wrapper(t, newDynamoDBStore(t, ddb, table), dedup.NewMemorySink(),
			func(ctx context.Context, m events.SQSMessage) error {
				cancel()
				<-ctx.Done()
				applied[m.MessageId]++
				return nil
			}))
		resp, _ := h(ctx, events.SQSEvent{Records: []events.SQSMessage{rec("m1", ptr("evt-1"), "a")}})
		if got := failures(resp); len(got) != 0 || applied["m1"] != 1 {
			t.Errorf("batch item failures %v, effects %v; want none and m1 once", got, applied)
		}
	})
}
