package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// headed is a message with headers, as a broker's: a letter moved back to
// its origin by hand carries its dedup-* metadata in them.
type headed struct {
	ID      string
	Body    string
	Headers map[string]string
}

var headedMessages = dedup.Messages[headed]{
	EventID: func(m headed) (string, error) { return m.ID, nil },
	Payload: func(m headed) []byte { return []byte(m.Body) },
	DeadLetter: func(m headed) dedup.DeadLetter {
		dl := dedup.DeadLetter{Payload: []byte(m.Body)}
		for k, v := range m.Headers {
			dl.Headers = append(dl.Headers, dedup.Header{Key: k, Value: []byte(v)})
		}
		return dl
	},
	TraceCarrier: func(m headed) propagation.TextMapCarrier { return propagation.MapCarrier(m.Headers) },
}

// movedBack returns the message a shovel makes of dl: its payload and every
// header, dedup's metadata included.
func movedBack(dl dedup.DeadLetter) headed {
	m := headed{ID: dl.EventID, Body: string(dl.Payload), Headers: map[string]string{}}
	for _, h := range dl.HeadersWithMetadata() {
		m.Headers[h.Key] = string(h.Value)
	}
	return m
}

// switchSink is a MemorySink that fails while down is set.
type switchSink struct {
	*dedup.MemorySink
	down atomic.Bool
}

func (s *switchSink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	if s.down.Load() {
		return errors.New("dead-letter queue unreachable")
	}
	return s.MemorySink.Send(ctx, dl)
}

// finalFixture is a consumer whose event "poison" failed for good.
type finalFixture struct {
	store dedup.Store
	sink  *switchSink
	logs  *logRecords
	runs  *runCounter
	w     *dedup.Wrapper[headed]
	// letter is poison's letter; rec its record once failed for good.
	letter dedup.DeadLetter
	rec    dedup.Record
}

// runCounter counts a handler's runs by event ID.
type runCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *runCounter) ran(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
}

func (c *runCounter) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// handler fails for good on an event whose body is "poison", and succeeds
// on any other.
func (c *runCounter) handler(id, body string) error {
	c.ran(id)
	if body == "poison" {
		return dedup.Permanent(errors.New("malformed refund"))
	}
	return nil
}

// newFinalFixture returns a consumer made by wrap, and dead-letters poison
// through it.
func newFinalFixture(t *testing.T, store dedup.Store, wrap func(t *testing.T, store dedup.Store, runs *runCounter, opts []dedup.Opt) *dedup.Wrapper[headed]) *finalFixture {
	t.Helper()
	f := &finalFixture{store: store, sink: &switchSink{MemorySink: dedup.NewMemorySink()}, logs: &logRecords{}, runs: &runCounter{}}
	f.w = wrap(t, store, f.runs, fastOpts(t, f.sink, dedup.WithLogger(slog.New(f.logs))))
	res, err := f.w.Handle(context.Background(), headed{ID: "p1", Body: "poison", Headers: map[string]string{"trace": "t1"}})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	letters := f.sink.Letters()
	require.Len(t, letters, 1)
	f.letter = letters[0]
	f.rec = f.record(t, "p1")
	require.Equal(t, dedup.StatusFailedFinal, f.rec.Status)
	return f
}

func (f *finalFixture) key(id string) dedup.Key { return dedup.Key{Scope: f.w.Scope(), EventID: id} }

func (f *finalFixture) record(t *testing.T, id string) dedup.Record {
	t.Helper()
	rec, err := f.store.Get(context.Background(), f.key(id))
	require.NoError(t, err)
	return rec
}

// release is the command the WARNs must name for id.
func (f *finalFixture) release(id string) string {
	return "dedup release -scope " + f.w.Scope() + " -id " + id + " -yes"
}

// requireWarned checks that msg was logged at WARN n times in all, the last
// naming id's key and the release command.
func (f *finalFixture) requireWarned(t *testing.T, msg string, n int, id string) {
	t.Helper()
	warned := f.logs.warnings(msg)
	require.Len(t, warned, n, msg)
	if n > 0 {
		require.Equal(t, f.key(id).String(), warned[n-1]["key"])
		require.Equal(t, f.release(id), warned[n-1]["release"])
	}
}

const (
	warnAlready = "dedup: event already dead-lettered; this copy is acknowledged without running"
	warnMoved   = "dedup: a dead letter came back to its origin while its event is failed for good; dead-lettered again without running"
)

// requireReparked checks that letter is poison's letter parked again.
func (f *finalFixture) requireReparked(t *testing.T, letter dedup.DeadLetter) {
	t.Helper()
	require.Equal(t, dedup.ReasonRedeliveredAfterFinal, letter.Reason)
	require.Equal(t, "p1", letter.EventID)
	require.Equal(t, f.w.Scope(), letter.Scope)
	require.Equal(t, []byte("poison"), letter.Payload)
	require.Equal(t, f.rec.Attempts, letter.Attempts)
	require.Equal(t, "malformed refund", letter.Cause, "the original failure stays the root cause")
	require.Contains(t, letter.Error, f.release("p1"))
	require.Contains(t, letter.Headers, dedup.Header{Key: "trace", Value: []byte("t1")}, "the original headers are kept")
}

// checkFinalRedelivery runs both cases on f, through handle: a copy without
// dead-letter metadata, then the letter moved back, with the sink down
// first; then releases the event, after which the letter runs.
func checkFinalRedelivery(t *testing.T, f *finalFixture, handle func(headed) (dedup.Result, error)) {
	t.Helper()
	ctx := context.Background()

	res, err := handle(headed{ID: "p1", Body: "poison", Headers: map[string]string{"trace": "t1"}})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
	require.Len(t, f.sink.Letters(), 1, "a redelivered copy has its letter already")
	f.requireWarned(t, warnAlready, 1, "p1")
	require.Equal(t, f.rec, f.record(t, "p1"))

	moved := movedBack(f.letter)
	f.sink.down.Store(true)
	_, err = handle(moved)
	require.Error(t, err, "a letter the sink refused is not acknowledged")
	require.Len(t, f.sink.Letters(), 1)
	f.requireWarned(t, warnMoved, 0, "p1")
	f.sink.down.Store(false)

	res, err = handle(moved)
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	require.Equal(t, dedup.ReasonRedeliveredAfterFinal, res.Reason)
	require.True(t, res.Settled())
	letters := f.sink.Letters()
	require.Len(t, letters, 2)
	f.requireReparked(t, letters[1])
	f.requireWarned(t, warnMoved, 1, "p1")
	f.requireWarned(t, warnAlready, 1, "p1")
	require.Equal(t, 1, f.runs.of("p1"), "the handler ran only the original attempt")
	require.Equal(t, f.rec, f.record(t, "p1"), "the record stays failed for good")

	// Released (dedup release), the event is claimable: the letter runs.
	done, err := f.store.(dedup.Admin).Forget(ctx, f.key("p1"), f.rec.Owner)
	require.NoError(t, err)
	require.True(t, done)
	res, err = handle(movedBack(dedup.DeadLetter{EventID: "p1", Payload: []byte("mended"), Headers: letters[1].Headers,
		Reason: letters[1].Reason}))
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
	require.Equal(t, 2, f.runs.of("p1"))
}

// A delivery of an event that failed for good is never dropped unsaid: a
// copy without dead-letter metadata is acknowledged as a duplicate with a
// WARN, a letter moved back by hand is dead-lettered again without
// running; both WARNs name the key and the release command, and the record
// stays FAILED_FINAL until released.
func TestFinalRedelivery(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			f := newFinalFixture(t, newStore(t), wrapHeaded)
			checkFinalRedelivery(t, f, func(m headed) (dedup.Result, error) { return f.w.Handle(context.Background(), m) })
		})
	}
	t.Run("inbox", func(t *testing.T) {
		f := newFinalFixture(t, newPostgresStore(t, testenv.Postgres(t)), wrapTxHeaded)
		checkFinalRedelivery(t, f, func(m headed) (dedup.Result, error) { return f.w.Handle(context.Background(), m) })
	})
}

// The same in a batch, among events that run (HandleBatch, HandleConcurrent
// and the inbox's shared transaction): the letter moved back is parked
// again once, even when a later event's failure rolls its segment back and
// runs it again.
func TestFinalRedeliveryBatch(t *testing.T) {
	type wrapping struct {
		newStore func(t *testing.T) dedup.Store
		wrap     func(t *testing.T, store dedup.Store, runs *runCounter, opts []dedup.Opt) *dedup.Wrapper[headed]
	}
	ways := map[string]wrapping{"inbox": {func(t *testing.T) dedup.Store { return newPostgresStore(t, testenv.Postgres(t)) }, wrapTxHeaded}}
	for name, newStore := range stores() {
		ways[name] = wrapping{newStore, wrapHeaded}
	}
	for name, way := range ways {
		for _, concurrent := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/concurrent=%t", name, concurrent), func(t *testing.T) {
				f := newFinalFixture(t, way.newStore(t), way.wrap)
				handle := func(batch []headed) []dedup.Result {
					t.Helper()
					out := make([]dedup.Result, len(batch))
					yield := func(i int, res dedup.Result, err error) {
						require.NoError(t, err, batch[i].ID)
						out[i] = res
					}
					if concurrent {
						require.NoError(t, f.w.HandleConcurrent(context.Background(), batch, yield))
					} else {
						require.NoError(t, f.w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
							yield(i, res, err)
							return true
						}))
					}
					return out
				}
				outcomes := func(rs []dedup.Result) []dedup.Outcome {
					var out []dedup.Outcome
					for _, r := range rs {
						out = append(out, r.Outcome)
					}
					return out
				}

				rs := handle([]headed{{ID: "a", Body: "a"}, {ID: "p1", Body: "poison"}, {ID: "b", Body: "b"}})
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDuplicate, dedup.OutcomeProcessed}, outcomes(rs))
				require.Len(t, f.sink.Letters(), 1)
				f.requireWarned(t, warnAlready, 1, "p1")

				rs = handle([]headed{movedBack(f.letter), {ID: "w", Body: "writes-poison"}, {ID: "c", Body: "c"}})
				require.Equal(t, []dedup.Outcome{dedup.OutcomeDeadLettered, dedup.OutcomeDeadLettered, dedup.OutcomeProcessed}, outcomes(rs))
				require.Equal(t, dedup.ReasonRedeliveredAfterFinal, rs[0].Reason)
				var reparked []dedup.DeadLetter
				for _, l := range f.sink.Letters() {
					if l.Reason == dedup.ReasonRedeliveredAfterFinal {
						reparked = append(reparked, l)
					}
				}
				require.Len(t, reparked, 1, "parked again once")
				f.requireReparked(t, reparked[0])
				require.Len(t, f.sink.Letters(), 3, "p1's, p1's again and w's")
				f.requireWarned(t, warnMoved, 1, "p1")
				require.Equal(t, 1, f.runs.of("p1"))
				require.Equal(t, 1, f.runs.of("c"))
				require.Equal(t, f.rec, f.record(t, "p1"))

				// A plain copy and the letter moved back in one batch: each
				// answered as it would be alone.
				rs = handle([]headed{{ID: "p1", Body: "poison"}, movedBack(f.letter)})
				require.Equal(t, []dedup.Outcome{dedup.OutcomeDuplicate, dedup.OutcomeDeadLettered}, outcomes(rs))
				require.Equal(t, dedup.ReasonRedeliveredAfterFinal, rs[1].Reason)
				require.Len(t, f.sink.Letters(), 4)
				f.requireReparked(t, f.sink.Letters()[3])
				f.requireWarned(t, warnAlready, 2, "p1")
				f.requireWarned(t, warnMoved, 2, "p1")
				require.Equal(t, 1, f.runs.of("p1"))
				require.Equal(t, f.rec, f.record(t, "p1"))
			})
		}
	}
}

// wrapHeaded returns a Wrap consumer whose handler is runs'.
func wrapHeaded(t *testing.T, store dedup.Store, runs *runCounter, opts []dedup.Opt) *dedup.Wrapper[headed] {
	t.Helper()
	w, err := dedup.Wrap(store, headedMessages, func(ctx context.Context, m headed) error {
		if m.Body == "writes-poison" {
			return runs.handler(m.ID, "poison")
		}
		return runs.handler(m.ID, m.Body)
	}, opts...)
	require.NoError(t, err)
	return w
}

// wrapTxHeaded returns a WrapTx consumer whose handler is runs', after a
// write of its own for an event whose body is "writes-poison" (a write
// that rolls back the batch's transaction it fails in).
func wrapTxHeaded(t *testing.T, store dedup.Store, runs *runCounter, opts []dedup.Opt) *dedup.Wrapper[headed] {
	t.Helper()
	pg := store.(*dedup.PostgresStore)
	ledger := newLedger(t, testenv.Postgres(t))
	w, err := dedup.WrapTx(pg, headedMessages, func(ctx context.Context, tx pgx.Tx, m headed) error {
		if m.Body != "writes-poison" {
			return runs.handler(m.ID, m.Body)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+ledger+` VALUES ($1, $2)`, m.ID, m.Body); err != nil {
			return err
		}
		return runs.handler(m.ID, "poison")
	}, opts...)
	require.NoError(t, err)
	return w
}
