package sqsreliability_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/awsfault"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

const notAcked = "sqsdedup: message not acknowledged; it will come back"

// notRecorded is what the wrapper logs when it retries the write of an
// outcome while the message is held.
const notRecorded = "dedup: outcome not recorded; retrying it while the delivery is held"

// outageSize is how many events an outage campaign sends, and for how long
// the outage lasts.
func outageSize() (events int, outage time.Duration) {
	if soak() {
		return 5000, 20 * time.Second
	}
	return 600, 4 * time.Second
}

// outageFigures are what an outage campaign counts at its end.
type outageFigures struct {
	events, messages, dups, poison int
	outage                         time.Duration
	refused                        int // store calls, or dead letters, refused during the outage
	effects, lost, appliedTwice    int
	explained                      int // applied twice after a Complete the outage refused
	deadLetters                    int
	deletes                        int
	elapsed                        time.Duration
}

func (f outageFigures) String() string {
	return fmt.Sprintf("events=%d messages=%d duplicates_injected=%d poison=%d outage=%v refused_calls=%d "+
		"effects=%d dead_letters=%d deletes=%d lost=%d applied_twice=%d applied_twice_after_refused_complete=%d elapsed=%v",
		f.events, f.messages, f.dups, f.poison, f.outage.Round(100*time.Millisecond), f.refused,
		f.effects, f.deadLetters, f.deletes, f.lost, f.appliedTwice, f.explained, f.elapsed.Round(time.Second))
}

// countOutage checks the end state of an outage campaign: every good event
// applied, every poison event dead-lettered and never applied.
func countOutage(t *testing.T, p *plan, eff *effects, dl map[string][]map[string]string) outageFigures {
	t.Helper()
	f := outageFigures{events: len(p.events), messages: len(p.messages), dups: p.dups, poison: p.poison}
	for _, e := range p.events {
		_, applied := eff.of(e.id)
		f.effects += applied
		f.deadLetters += len(dl[e.id])
		switch {
		case e.poison && applied > 0:
			t.Errorf("poison event %s applied", e.id)
		case e.poison && len(dl[e.id]) == 0:
			f.lost++
			t.Errorf("poison event %s not dead-lettered", e.id)
		case !e.poison && len(dl[e.id]) > 0:
			t.Errorf("good event %s dead-lettered: %v", e.id, dl[e.id])
		case !e.poison && applied == 0:
			f.lost++
			t.Errorf("event %s lost", e.id)
		case applied > 1:
			f.appliedTwice++
		}
	}
	return f
}

// callFailures counts the calls of a client that returned an error.
type callFailures struct{ n atomic.Int64 }

func (c *callFailures) APIOption(stack *middleware.Stack) error {
	return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("callFailures",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			out, md, err := next.HandleInitialize(ctx, in)
			if err != nil {
				c.n.Add(1)
			}
			return out, md, err
		}), middleware.Before)
}

// TestDynamoDBOutage kills a private DynamoDB Local (the store) with SIGKILL
// while two consumers work through a queue, and starts it again a few
// seconds later. Meanwhile the consumers acknowledge nothing they could not
// record: their messages come back after the visibility timeout (the
// consumers' backoff). Afterwards every event is applied, every poison event
// parked, and every message deleted was settled in the store first. An
// effect applied twice must be one whose Complete the outage refused.
func TestDynamoDBOutage(t *testing.T) {
	events, outage := outageSize()
	server := testenv.StartDynamoDBLocal(t)
	refused := &callFailures{}
	ddb := dynamodb.New(server.Client().Options(), func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, refused.APIOption)
	})
	store, err := dedup.NewDynamoDBStore(ddb, dedup.WithTable(dynamoDBTable(t, ddb)))
	if err != nil {
		t.Fatal(err)
	}
	deletes := newDeleteLog()
	plain := testenv.SQS(t)
	c := withAPIOptions(plain, deletes.APIOption)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "2"})
	dlq := testenv.SQSQueue(t, c, nil)
	sink, err := sqsdedup.NewSink(plain, dlq)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecords{}
	eff := newEffects()
	scope := "sqsrel-ddb-outage-" + runID()
	w, err := dedup.Wrap(store, sqsdedup.Messages(url), eff.handler, dedup.WithScope(scope), dedup.WithSink(sink),
		dedup.WithMaxAttempts(3), dedup.WithBackoff(func(int) time.Duration { return 0 }), dedup.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	p := newPlan("ddb", events, 0.3, 0.03, rand.New(rand.NewPCG(rand.Uint64(), 1)))

	start := time.Now()
	for range 2 {
		runConsumer(t, c, url, w, sqsdedup.WithWorkers(8), sqsdedup.WithLogger(logs.logger()))
	}
	produced := produceOver(c, url, p.messages, 6*time.Second)
	crashtest.Await(t, "a third of the events applied", func() bool { return eff.distinct() >= p.good()/3 }, eff.distinct, func() string {
		return fmt.Sprintf("%d/%d applied", eff.distinct(), p.good())
	})

	server.Kill()
	down := time.Now()
	refusedBefore := refused.n.Load()
	deletesBefore := len(deletes.deleted())
	time.Sleep(outage)
	if err := <-produced; err != nil {
		t.Fatalf("producing: %v", err)
	}
	server.Start()
	fig := outageFigures{outage: time.Since(down), refused: int(refused.n.Load() - refusedBefore)}
	t.Logf("store down for %v: %d calls refused, %d deletes sent meanwhile (of messages settled before)",
		fig.outage.Round(100*time.Millisecond), fig.refused, len(deletes.deleted())-deletesBefore)
	// A handler that succeeded has its completion retried while its message
	// is held; the others are reported and come back.
	if len(logs.errors(notAcked))+len(logs.errors(notRecorded)) == 0 {
		t.Error("no consumer reported a message it could not acknowledge or an outcome it could not record during the outage")
	}

	crashtest.Await(t, "every event settled after the outage", func() bool {
		return queueTotal(t, c, url) == 0 && eff.distinct() == p.good()
	}, func() int { return eff.distinct() - queueTotal(t, c, url) }, func() string {
		return fmt.Sprintf("applied %d/%d, queue %d", eff.distinct(), p.good(), queueTotal(t, c, url))
	})
	counted := countOutage(t, p, eff, letters(t, drainDLQ(t, plain, dlq)))
	counted.outage, counted.refused, counted.deletes = fig.outage, fig.refused, len(deletes.deleted())
	counted.elapsed = time.Since(start)
	checkDeletesSettled(t, store, scope, deletes)

	// An effect is applied twice when the outage refused the Complete that
	// followed it: the record stayed PROCESSING, and the message came back.
	// The store names the step and the key in its error ("dedup: dynamodb
	// complete <key>: ...").
	refusedComplete := logs.keys(notAcked, func(err error) bool { return strings.Contains(err.Error(), " complete "+scope+"/") })
	for _, e := range p.events {
		if _, applied := eff.of(e.id); applied > 1 {
			if refusedComplete[scope+"/"+e.id] {
				counted.explained++
			} else {
				t.Errorf("event %s applied %d times, though its Complete was never refused", e.id, applied)
			}
		}
	}
	t.Logf("DynamoDB outage: %s", counted)
	// No hot loop: a message whose claim fails waits out its visibility
	// timeout (2 s) before it is tried again.
	if limit := 4 * len(p.messages) * int(fig.outage/(2*time.Second)+2); fig.refused > limit {
		t.Errorf("%d store calls refused during a %v outage, over %d: the consumers did not back off", fig.refused, fig.outage, limit)
	}
}

// TestDLQOutage makes every SendMessage to the DLQ fail for a while: the
// poison events' originals stay in their queue (none is deleted, the DLQ
// stays empty), and once the fault clears they are parked with their
// metadata. Good events are applied once each meanwhile.
func TestDLQOutage(t *testing.T) {
	events, _ := outageSize()
	events /= 2
	const maxAttempts = 3
	deletes := newDeleteLog()
	plain := testenv.SQS(t)
	c := withAPIOptions(plain, deletes.APIOption)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "2"})
	dlq := testenv.SQSQueue(t, c, nil)
	fault := awsfault.Fail(errors.New("injected: DLQ unavailable"), "SendMessage")
	fault.On()
	sink, err := sqsdedup.NewSink(withAPIOptions(plain, fault.APIOption), dlq)
	if err != nil {
		t.Fatal(err)
	}
	ddb := testenv.DynamoDB(t)
	store, err := dedup.NewDynamoDBStore(ddb, dedup.WithTable(dynamoDBTable(t, ddb)))
	if err != nil {
		t.Fatal(err)
	}
	logs := &logRecords{}
	eff := newEffects()
	scope := "sqsrel-dlq-outage-" + runID()
	w, err := dedup.Wrap(store, sqsdedup.Messages(url), eff.handler, dedup.WithScope(scope), dedup.WithSink(sink),
		dedup.WithMaxAttempts(maxAttempts), dedup.WithBackoff(func(int) time.Duration { return 0 }), dedup.WithLogger(logs.logger()))
	if err != nil {
		t.Fatal(err)
	}
	p := newPlan("dlq", events, 0.3, 0.1, rand.New(rand.NewPCG(rand.Uint64(), 2)))
	poison := map[string]bool{}
	for _, e := range p.events {
		if e.poison {
			poison[e.id] = true
		}
	}

	start := time.Now()
	for range 2 {
		runConsumer(t, c, url, w, sqsdedup.WithWorkers(8), sqsdedup.WithLogger(logs.logger()))
	}
	if err := <-produceOver(c, url, p.messages, 2*time.Second); err != nil {
		t.Fatalf("producing: %v", err)
	}
	// Every poison event's dead letter refused at least twice: its original
	// came back after the first refusal.
	crashtest.Await(t, "good events applied and dead letters refused", func() bool {
		return eff.distinct() == p.good() && fault.Hits() >= 2*p.poison
	}, func() int { return eff.distinct() + int(fault.Hits()) }, func() string {
		return fmt.Sprintf("applied %d/%d, dead letters refused %d (want %d)", eff.distinct(), p.good(), fault.Hits(), 2*p.poison)
	})
	if n := queueTotal(t, c, dlq); n != 0 {
		t.Errorf("the DLQ holds %d messages while every send to it fails", n)
	}
	if n := queueTotal(t, c, url); n < p.poison {
		t.Errorf("the queue holds %d messages, fewer than the %d poison events", n, p.poison)
	}
	for _, d := range deletes.deleted() {
		if poison[d.eventID] {
			t.Errorf("poison event %s deleted while its dead letter could not be written", d.eventID)
		}
	}
	refused := fault.Hits()
	fault.Off()
	outage := time.Since(start)

	crashtest.Await(t, "the queue drained once the DLQ works", func() bool { return queueTotal(t, c, url) == 0 },
		func() int { return -queueTotal(t, c, url) }, func() string { return fmt.Sprintf("%d messages left", queueTotal(t, c, url)) })
	dl := letters(t, drainDLQ(t, plain, dlq))
	fig := countOutage(t, p, eff, dl)
	fig.outage, fig.refused, fig.deletes, fig.elapsed = outage, refused, len(deletes.deleted()), time.Since(start)
	checkDeletesSettled(t, store, scope, deletes)
	for id := range poison {
		runs, _ := eff.of(id)
		if runs < 1 || runs > maxAttempts {
			t.Errorf("poison event %s ran %d times, want 1 to %d", id, runs, maxAttempts)
		}
		for _, meta := range dl[id] {
			if meta["dedup-reason"] != string(dedup.ReasonHandlerError) || !strings.Contains(meta["dedup-cause"], "poison") ||
				meta["dedup-scope"] != scope || meta["dedup-origin-queue"] != url {
				t.Errorf("dead letter of %s: %v", id, meta)
			}
		}
	}
	if fig.appliedTwice > 0 {
		t.Errorf("%d events applied twice without any crash or store outage", fig.appliedTwice)
	}
	t.Logf("DLQ outage: %s", fig)
}
