package dedup_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
)

// countingStore counts the completion writes reaching a real store.
type countingStore struct {
	dedup.Store
	completes, batches atomic.Int32
}

func (s *countingStore) Complete(ctx context.Context, key dedup.Key, owner string, result []byte, ttl time.Duration) error {
	s.completes.Add(1)
	return s.Store.Complete(ctx, key, owner, result, ttl)
}

func (s *countingStore) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	s.batches.Add(1)
	return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
}

// flakyCompleter fails its first CompleteBatch calls: before writing
// (lost requests), or after writing (lost answers).
type flakyCompleter struct {
	dedup.Store
	failures   int
	afterWrite bool
	calls      atomic.Int32
}

var errCompleterDown = errors.New("store unreachable")

func (s *flakyCompleter) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	n := int(s.calls.Add(1))
	if n <= s.failures && !s.afterWrite {
		return nil, errCompleterDown
	}
	errs, err := s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
	if n <= s.failures {
		return nil, errCompleterDown
	}
	return errs, err
}

// plainStore hides a store's BatchCompleter.
type plainStore struct{ dedup.Store }

func TestBatchCompletion(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()

			t.Run("OneWriteAndDurableBeforeYield", func(t *testing.T) {
				store := &countingStore{Store: newStore(t)}
				var ran atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					ran.Add(1)
					return nil
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute))...)
				require.NoError(t, err)
				// Settle two events first, to be duplicates in the batch.
				for _, id := range []string{"e0", "e1"} {
					require.Equal(t, dedup.OutcomeProcessed, deliverUntilSettled(t, w, event{ID: id, Body: "x"}).Outcome)
				}
				store.completes.Store(0)
				ran.Store(0)
				var batch []event
				for i := range 50 {
					batch = append(batch, event{ID: "e" + strconv.Itoa(i), Body: "x"})
				}
				var outcomes []dedup.Outcome
				err = w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
					require.NoError(t, err)
					require.Len(t, outcomes, i, "in order")
					outcomes = append(outcomes, res.Outcome)
					rec, gerr := store.Get(ctx, res.Key)
					require.NoError(t, gerr)
					require.Equal(t, dedup.StatusSucceeded, rec.Status, "%s is recorded before it is given back", res.Key)
					return true
				})
				require.NoError(t, err)
				require.Len(t, outcomes, 50)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeDuplicate, dedup.OutcomeDuplicate, dedup.OutcomeProcessed}, outcomes[:3])
				require.EqualValues(t, 48, ran.Load())
				require.EqualValues(t, 0, store.completes.Load(), "no completion on its own")
				require.EqualValues(t, 1, store.batches.Load(), "one completion write for the batch")
			})

			t.Run("RepeatInBatchIsDuplicate", func(t *testing.T) {
				store := &countingStore{Store: newStore(t)}
				var ran atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					ran.Add(1)
					return nil
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute))...)
				require.NoError(t, err)
				batch := []event{{ID: "a", Body: "x"}, {ID: "b", Body: "x"}, {ID: "a", Body: "x"}, {ID: "c", Body: "x"}}
				var outcomes []dedup.Outcome
				err = w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
					require.NoError(t, err)
					outcomes = append(outcomes, res.Outcome)
					return true
				})
				require.NoError(t, err)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeDuplicate, dedup.OutcomeProcessed}, outcomes)
				require.EqualValues(t, 3, ran.Load())
				require.EqualValues(t, 1, store.batches.Load(), "the repeat is answered from its earlier copy")
				require.EqualValues(t, 0, store.completes.Load())
			})

			t.Run("LeaseLostAtCompletion", func(t *testing.T) {
				store := newStore(t)
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					if e.Body != "stolen" {
						return nil
					}
					// Another worker takes the record over while this one runs.
					k := dedup.Key{Scope: scopeFrom(ctx), EventID: e.ID}
					rec, err := store.Get(ctx, k)
					if err != nil {
						return err
					}
					return store.Fail(ctx, k, rec.Owner, dedup.Failure{Error: "taken", TTL: time.Hour})
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute))...)
				require.NoError(t, err)
				ctx := context.WithValue(ctx, scopeKey{}, w.Scope())
				batch := []event{{ID: "s1", Body: "x"}, {ID: "s2", Body: "stolen"}, {ID: "s2", Body: "stolen"}, {ID: "s3", Body: "x"}}
				var errs []error
				var outcomes []dedup.Outcome
				err = w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
					errs = append(errs, err)
					outcomes = append(outcomes, res.Outcome)
					return true
				})
				require.NoError(t, err)
				require.Len(t, errs, 4)
				require.NoError(t, errs[0])
				require.ErrorIs(t, errs[1], dedup.ErrLeaseLost)
				require.ErrorIs(t, errs[2], dedup.ErrLeaseLost, "a repeat of an event whose completion was lost is not a duplicate")
				require.NoError(t, errs[3])
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, 0, 0, dedup.OutcomeProcessed}, outcomes)
			})

			// A transport stops at the first unsettled result; the lost
			// leases after it are still reported, each a possible repeat.
			t.Run("EveryLostLeaseReported", func(t *testing.T) {
				store := newStore(t)
				var logs bytes.Buffer
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					k := dedup.Key{Scope: scopeFrom(ctx), EventID: e.ID}
					rec, err := store.Get(ctx, k)
					if err != nil {
						return err
					}
					return store.Fail(ctx, k, rec.Owner, dedup.Failure{Error: "taken", TTL: time.Hour})
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute),
					dedup.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))...)
				require.NoError(t, err)
				ctx := context.WithValue(ctx, scopeKey{}, w.Scope())
				var given int
				err = w.HandleBatch(ctx, []event{{ID: "r1", Body: "x"}, {ID: "r2", Body: "x"}, {ID: "r3", Body: "x"}},
					func(i int, res dedup.Result, err error) bool {
						given++
						return res.Settled()
					})
				require.NoError(t, err)
				require.Equal(t, 1, given)
				require.Equal(t, 3, strings.Count(logs.String(), "level=ERROR msg=\"dedup: lease lost: another worker took this event over while it ran"), logs.String())
				for _, id := range []string{"r1", "r2", "r3"} {
					require.Contains(t, logs.String(), "/"+id+" op=complete")
				}
			})

			t.Run("UnsettledStopsAfterWriting", func(t *testing.T) {
				store := newStore(t)
				var ran atomic.Int32
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					ran.Add(1)
					if e.Body == "fail" {
						return errors.New("try again")
					}
					return nil
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute), dedup.WithLease(time.Minute))...)
				require.NoError(t, err)
				batch := []event{{ID: "u1", Body: "x"}, {ID: "u2", Body: "x"}, {ID: "u3", Body: "fail"}, {ID: "u4", Body: "x"}}
				var outcomes []dedup.Outcome
				err = w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
					require.NoError(t, err)
					outcomes = append(outcomes, res.Outcome)
					return res.Settled() // as a transport does: wait in place
				})
				require.NoError(t, err)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeRetry}, outcomes)
				require.EqualValues(t, 3, ran.Load())
				for _, id := range []string{"u1", "u2"} {
					rec, err := store.Get(ctx, dedup.Key{Scope: w.Scope(), EventID: id})
					require.NoError(t, err)
					require.Equal(t, dedup.StatusSucceeded, rec.Status)
				}
				res, err := w.Handle(ctx, event{ID: "u4", Body: "x"})
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeProcessed, res.Outcome, "the unstarted claim was given back")
				require.Equal(t, 1, res.Attempts)
			})

			t.Run("MaxWaitBoundsTheDelay", func(t *testing.T) {
				// A success queued is written once its wait is up, by the
				// completer's timer, while the next handler runs: each handler
				// from the second on lasts until the one before it is written.
				store := &countingStore{Store: newStore(t)}
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
					n, _ := strconv.Atoi(strings.TrimPrefix(e.ID, "m"))
					deadline := time.Now().Add(10 * time.Second)
					for store.batches.Load() < int32(n) {
						if time.Now().After(deadline) {
							return fmt.Errorf("%s: the success before it was not written within its wait", e.ID)
						}
						time.Sleep(time.Millisecond)
					}
					return nil
				}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(20*time.Millisecond))...)
				require.NoError(t, err)
				var batch []event
				for i := range 5 {
					batch = append(batch, event{ID: "m" + strconv.Itoa(i), Body: "x"})
				}
				n := 0
				err = w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
					require.NoError(t, err)
					require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
					n++
					return true
				})
				require.NoError(t, err)
				require.Equal(t, 5, n)
				require.EqualValues(t, 5, store.batches.Load(), "each success written on its own, within its wait")
			})

			t.Run("CompletionRetriedWhileHeld", func(t *testing.T) {
				for _, afterWrite := range []bool{false, true} {
					store := &flakyCompleter{Store: newStore(t), failures: 2, afterWrite: afterWrite}
					w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error { return nil },
						fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute), dedup.WithLease(10*time.Second))...)
					require.NoError(t, err)
					batch := []event{{ID: "f1", Body: "x"}, {ID: "f2", Body: "x"}}
					err = w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
						require.NoError(t, err, "answers lost: %v", afterWrite)
						require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
						return true
					})
					require.NoError(t, err)
					require.EqualValues(t, 3, store.calls.Load())
				}
			})

			// Batch completion asked for on a store that cannot batch is a
			// configuration error, not a silent fallback to one write each;
			// by default such a store completes one event at a time.
			t.Run("StoreWithoutBatchCompleter", func(t *testing.T) {
				_, err := dedup.Wrap(plainStore{newStore(t)}, events, func(ctx context.Context, e event) error { return nil },
					fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute))...)
				require.ErrorIs(t, err, dedup.ErrConfig)
				require.ErrorContains(t, err, "WithBatchCompletion")

				store := &countingStore{Store: newStore(t)}
				w, err := dedup.Wrap(plainStore{store}, events, func(ctx context.Context, e event) error { return nil },
					fastOpts(t, dedup.NewMemorySink())...)
				require.NoError(t, err)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed}, handleAll(t, w, "p1", "p2"))
				require.EqualValues(t, 2, store.completes.Load())
			})

			// The default completes a batch's successes in one write;
			// WithBatchCompletion(0) completes each on its own.
			t.Run("DefaultAndZero", func(t *testing.T) {
				store := &countingStore{Store: newStore(t)}
				w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error { return nil },
					fastOpts(t, dedup.NewMemorySink())...)
				require.NoError(t, err)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeProcessed}, handleAll(t, w, "d1", "d2", "d3"))
				require.EqualValues(t, 1, store.batches.Load())
				require.Zero(t, store.completes.Load())

				store = &countingStore{Store: newStore(t)}
				w, err = dedup.Wrap(store, events, func(ctx context.Context, e event) error { return nil },
					fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(0))...)
				require.NoError(t, err)
				require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeProcessed}, handleAll(t, w, "z1", "z2", "z3"))
				require.Zero(t, store.batches.Load())
				require.EqualValues(t, 3, store.completes.Load())
			})
		})
	}
}

// handleAll runs one batch of events with the given IDs and returns their
// outcomes, failing on any error.
func handleAll(t *testing.T, w *dedup.Wrapper[event], ids ...string) []dedup.Outcome {
	t.Helper()
	batch := make([]event, len(ids))
	for i, id := range ids {
		batch[i] = event{ID: id, Body: "x"}
	}
	var outcomes []dedup.Outcome
	require.NoError(t, w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
		require.NoError(t, err)
		outcomes = append(outcomes, res.Outcome)
		return true
	}))
	return outcomes
}

type scopeKey struct{}

func scopeFrom(ctx context.Context) string { return ctx.Value(scopeKey{}).(string) }

func TestBatchCompletionNeedsNonNegativeWait(t *testing.T) {
	_, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error { return nil },
		dedup.WithScope("s"), dedup.WithSink(dedup.NewMemorySink()), dedup.WithBatchCompletion(-time.Second))
	require.ErrorIs(t, err, dedup.ErrConfig)
}

// A transport's stop signal ends a batch after the handler running when it
// came, even while successes wait to be completed together: their results
// are given, and the rest of the batch is given back unstarted.
func TestCallStop(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			stop := make(chan struct{})
			var ran []string
			w, err := dedup.Wrap(newStore(t), events, func(ctx context.Context, e event) error {
				ran = append(ran, e.ID)
				if e.ID == "s2" {
					close(stop) // the transport shuts down while s2 runs
				}
				return nil
			}, fastOpts(t, dedup.NewMemorySink(), dedup.WithBatchCompletion(time.Minute), dedup.WithLease(time.Minute))...)
			require.NoError(t, err)
			batch := []event{{ID: "s1", Body: "x"}, {ID: "s2", Body: "x"}, {ID: "s3", Body: "x"}}
			var given []string
			require.NoError(t, w.HandleBatch(context.Background(), batch, func(i int, res dedup.Result, err error) bool {
				require.NoError(t, err)
				require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
				given = append(given, batch[i].ID)
				return true
			}, dedup.CallStop(stop)))
			require.Equal(t, []string{"s1", "s2"}, ran)
			require.Equal(t, []string{"s1", "s2"}, given)
			res, err := w.Handle(context.Background(), batch[2]) // s3 was given back: claimable at once
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
			require.Equal(t, 1, res.Attempts)
		})
	}
}

// A key taken over from a dead worker is set aside for a segment of its
// own; when the transport stops the batch before that segment, its claim is
// given back, not left held until its lease runs out (and counted as one
// more death of a worker at its next claim).
func TestCallStopGivesBackATakeover(t *testing.T) {
	store := dedup.NewMemoryStore()
	stop := make(chan struct{})
	var ran []string
	w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
		ran = append(ran, e.ID)
		if e.ID == "s1" {
			close(stop) // the transport shuts down while the first event runs
		}
		return nil
	}, fastOpts(t, dedup.NewMemorySink(), dedup.WithLease(time.Minute))...)
	require.NoError(t, err)
	// t2's worker died: its claim, with a lease already over, is
	// PROCESSING.
	key := dedup.Key{Scope: w.Scope(), EventID: "t2"}
	fp, err := dedup.SHA256Fingerprint()([]byte("x"))
	require.NoError(t, err)
	_, err = store.Claim(context.Background(), dedup.ClaimRequest{Key: key, Fingerprint: fp, Lease: time.Nanosecond, TTL: time.Hour})
	require.NoError(t, err)

	batch := []event{{ID: "s1", Body: "x"}, {ID: "t2", Body: "x"}, {ID: "s3", Body: "x"}}
	require.NoError(t, w.HandleBatch(context.Background(), batch, func(int, dedup.Result, error) bool { return true }, dedup.CallStop(stop)))
	require.Equal(t, []string{"s1"}, ran)
	res, err := w.Handle(context.Background(), batch[1])
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeProcessed, res.Outcome, "t2's claim was left held")
	require.Equal(t, 2, res.Attempts, "the claim given back counts no attempt")
}

// itemFlaky answers its first CompleteBatch with a transport error for every
// other completion, which it does not write, as a store sending one request
// per completion does when some of them fail.
type itemFlaky struct {
	dedup.Store
	calls atomic.Int32
}

func (s *itemFlaky) CompleteBatch(ctx context.Context, cs []deduptype.Completion) ([]error, error) {
	if s.calls.Add(1) > 1 {
		return s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, cs)
	}
	var write []deduptype.Completion
	var at []int
	errs := make([]error, len(cs))
	for i := range cs {
		if i%2 == 1 {
			errs[i] = errCompleterDown
			continue
		}
		write, at = append(write, cs[i]), append(at, i)
	}
	done, err := s.Store.(deduptype.BatchCompleter).CompleteBatch(ctx, write)
	if err != nil {
		return nil, err
	}
	for k, i := range at {
		errs[i] = done[k]
	}
	return errs, nil
}

// A completion a store answers with an error of its own is tried again
// while the claims hold, like a failed batch write: none of the batch is
// left to run again. (It was not: DynamoDB's outage campaign applied events
// twice once batch completion became the default.)
func TestBatchCompletionRetriesFailedItems(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			store := &itemFlaky{Store: newStore(t)}
			var ran atomic.Int32
			w, err := dedup.Wrap(store, events, func(context.Context, event) error {
				ran.Add(1)
				return nil
			}, fastOpts(t, dedup.NewMemorySink(), dedup.WithLease(time.Minute))...)
			require.NoError(t, err)
			outcomes := handleAll(t, w, "i1", "i2", "i3", "i4")
			require.Equal(t, []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeProcessed, dedup.OutcomeProcessed}, outcomes)
			require.EqualValues(t, 2, store.calls.Load(), "the failed two written again")
			require.Equal(t, []dedup.Outcome{dedup.OutcomeDuplicate, dedup.OutcomeDuplicate, dedup.OutcomeDuplicate, dedup.OutcomeDuplicate},
				handleAll(t, w, "i1", "i2", "i3", "i4"))
			require.EqualValues(t, 4, ran.Load())
		})
	}
}

// TestBatchesShareNothing runs HandleBatch on one wrapper from many
// goroutines at once, each batch holding bad input and a repeated key at the
// same places, as a transport's fetches do: whatever a batch keeps for the
// next, each call must answer from its own messages alone.
func TestBatchesShareNothing(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			var ran atomic.Int32
			sink := dedup.NewMemorySink()
			w, err := dedup.Wrap(newStore(t), events, func(ctx context.Context, e event) error {
				ran.Add(1)
				return nil
			}, fastOpts(t, sink, dedup.WithBatchCompletion(time.Minute))...)
			require.NoError(t, err)

			const goroutines, rounds = 8, 10
			errs := make(chan error, goroutines)
			for g := range goroutines {
				go func() {
					errs <- func() error {
						for r := range rounds {
							// Each round's batch is a size of its own, so that
							// a batch reuses a longer one's slices.
							id := func(k int) string { return strconv.Itoa(g) + "-" + strconv.Itoa(r) + "-" + strconv.Itoa(k) }
							batch := []event{{ID: "", Body: "no id " + id(0)}, {ID: id(1), Body: "x"}, {ID: id(1), Body: "x"}}
							for k := range r % 4 {
								batch = append(batch, event{ID: id(k + 2), Body: "x"})
							}
							want := []dedup.Outcome{dedup.OutcomeDeadLettered, dedup.OutcomeProcessed, dedup.OutcomeDuplicate}
							for range r % 4 {
								want = append(want, dedup.OutcomeProcessed)
							}
							var got []dedup.Outcome
							err := w.HandleBatch(ctx, batch, func(i int, res dedup.Result, err error) bool {
								if err != nil {
									got = append(got, 0)
									return true
								}
								got = append(got, res.Outcome)
								return true
							})
							if err != nil {
								return err
							}
							if !slices.Equal(got, want) {
								return fmt.Errorf("goroutine %d round %d: outcomes %v, want %v", g, r, got, want)
							}
						}
						return nil
					}()
				}()
			}
			for range goroutines {
				require.NoError(t, <-errs)
			}
			var handled int32
			for r := range rounds {
				handled += int32(1 + r%4)
			}
			require.EqualValues(t, goroutines*handled, ran.Load(), "each new key's handler ran once")
			require.Len(t, sink.Letters(), goroutines*rounds, "each batch's bad message dead-lettered")
		})
	}
}
