package dedup_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// warnings returns the WARN records logged with msg, each as its
// attributes by key.
func (h *logRecords) warnings(msg string) []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.recs {
		if r.Level != slog.LevelWarn || r.Message != msg {
			continue
		}
		attrs := map[string]string{}
		r.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs)
	}
	return out
}

// requirePanicStack checks that stack is a handler's panic stack: the
// goroutine's header, then the frame of the function that panicked
// (frame), without the recovery's own frames, in at most limit bytes.
func requirePanicStack(t *testing.T, stack, frame string, limit int) {
	t.Helper()
	require.True(t, strings.HasPrefix(stack, "goroutine "), "the goroutine's header first: %q", stack)
	require.Contains(t, stack, frame)
	require.NotContains(t, stack, "runtime/debug.Stack")
	require.NotContains(t, stack, "capturePanic")
	require.LessOrEqual(t, len(stack), limit)
}

// A handler's panic is retried like an error, with its stack in the WARN
// that retries it; on its last attempt it is dead-lettered with the stack
// in the WARN and, cut shorter, in the letter and its metadata.
func TestPanicStackIsLoggedAndLettered(t *testing.T) {
	for name, newStore := range stores() {
		t.Run(name, func(t *testing.T) {
			store, sink, logs := newStore(t), dedup.NewMemorySink(), &logRecords{}
			w, err := dedup.Wrap(store, events, func(ctx context.Context, e event) error {
				panicInHandler(e.ID)
				return nil
			}, fastOpts(t, sink, dedup.WithMaxAttempts(2), dedup.WithLogger(slog.New(logs)))...)
			require.NoError(t, err)
			const frame = "dedup_test.panicInHandler"

			res, err := w.Handle(context.Background(), event{ID: "p1", Body: "x"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeRetry, res.Outcome)
			retried := logs.warnings("dedup: handler panicked; will retry")
			require.Len(t, retried, 1)
			require.Equal(t, res.Key.String(), retried[0]["key"])
			require.Equal(t, "1", retried[0]["attempt"])
			require.Contains(t, retried[0]["error"], "corrupt state in p1")
			requirePanicStack(t, retried[0]["stack"], frame, 8<<10)
			require.Empty(t, sink.Letters())

			res = deliverUntilSettled(t, w, event{ID: "p1", Body: "x"})
			require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
			require.Equal(t, dedup.ReasonPanic, res.Reason)
			parked := logs.warnings("dedup: message dead-lettered")
			require.Len(t, parked, 1)
			require.Equal(t, "2", parked[0]["attempts"])
			requirePanicStack(t, parked[0]["stack"], frame, 8<<10)
			require.Len(t, logs.warnings("dedup: handler panicked; will retry"), 1, "the last attempt is logged as dead-lettered only")

			letters := sink.Letters()
			require.Len(t, letters, 1)
			requirePanicStack(t, letters[0].Stack, frame, 2<<10)
			requireStackHeader(t, letters[0])
		})
	}
}

// requireStackHeader checks dl's dedup-stack metadata: its stack on one
// line, which unescaped is the letter's Stack.
func requireStackHeader(t *testing.T, dl dedup.DeadLetter) {
	t.Helper()
	var header []string
	for _, h := range dl.HeadersWithMetadata() {
		if h.Key == "dedup-stack" {
			header = append(header, string(h.Value))
		}
	}
	require.Len(t, header, 1)
	require.NotContains(t, header[0], "\n")
	require.NotContains(t, header[0], "\r")
	unescaped := strings.NewReplacer(`\\`, `\`, `\n`, "\n", `\r`, "\r").Replace(header[0])
	require.Equal(t, dl.Stack, unescaped)
}

// deadLettered delivers the event id once to w, which must dead-letter it.
func deadLettered(t *testing.T, w *dedup.Wrapper[event], id string) dedup.Result {
	t.Helper()
	res, err := w.Handle(context.Background(), event{ID: id, Body: "x"})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	return res
}

//go:noinline
func panicInHandler(id string) { panic(fmt.Sprintf("corrupt state in %s", id)) }

// A stack longer than the bounds is cut at a line: 8 KiB in the log, 2 KiB
// in the letter, each ending with a mark that says so.
func TestPanicStackIsCut(t *testing.T) {
	sink, logs := dedup.NewMemorySink(), &logRecords{}
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(ctx context.Context, e event) error {
		deepPanic(300)
		return nil
	}, fastOpts(t, sink, dedup.WithMaxAttempts(1), dedup.WithLogger(slog.New(logs)))...)
	require.NoError(t, err)
	res := deadLettered(t, w, "deep")
	var perr *dedup.PanicError
	require.ErrorAs(t, res.Err, &perr)
	require.Greater(t, len(perr.Stack), 8<<10, "the stack this test makes is longer than the log's bound")

	parked := logs.warnings("dedup: message dead-lettered")
	require.Len(t, parked, 1)
	logged := parked[0]["stack"]
	requirePanicStack(t, logged, "dedup_test.deepPanic", 8<<10)
	require.Greater(t, len(logged), 7<<10, "cut near the bound, not far below it")
	require.True(t, strings.HasSuffix(logged, "\n...(cut)"), "ends %q", logged[len(logged)-40:])

	letter := sink.Letters()[0].Stack
	requirePanicStack(t, letter, "dedup_test.deepPanic", 2<<10)
	require.True(t, strings.HasSuffix(letter, "\n...(cut)"))
	require.True(t, strings.HasPrefix(logged, strings.TrimSuffix(letter, "\n...(cut)")), "both cut from the same stack")
	requireStackHeader(t, sink.Letters()[0])
}

//go:noinline
func deepPanic(n int) {
	if n == 0 {
		panic("too deep")
	}
	deepPanic(n - 1)
}

// In a batch, a panic is logged once per attempt: a later copy of its key,
// answered from the first's outcome, ran nothing and logs nothing. The
// transactional inbox, which runs the batch again without the event whose
// handler panicked, logs it once too.
func TestPanicInBatchIsLoggedOncePerAttempt(t *testing.T) {
	handler := func(ctx context.Context, e event) error {
		if e.ID == "bad" {
			panicInHandler(e.ID)
		}
		return nil
	}
	wrappers := map[string]func(t *testing.T, opts ...dedup.Opt) (*dedup.Wrapper[event], error){
		"WrapTx": func(t *testing.T, opts ...dedup.Opt) (*dedup.Wrapper[event], error) {
			return dedup.WrapTx(newPostgresStore(t, testenv.Postgres(t)), events,
				func(ctx context.Context, _ pgx.Tx, e event) error { return handler(ctx, e) }, opts...)
		},
	}
	for name, newStore := range stores() {
		wrappers["Wrap/"+name] = func(t *testing.T, opts ...dedup.Opt) (*dedup.Wrapper[event], error) {
			return dedup.Wrap(newStore(t), events, handler, opts...)
		}
	}
	for name, wrap := range wrappers {
		t.Run(name, func(t *testing.T) {
			logs := &logRecords{}
			w, err := wrap(t, fastOpts(t, dedup.NewMemorySink(), dedup.WithLogger(slog.New(logs)))...)
			require.NoError(t, err)
			msgs := []event{{ID: "bad", Body: "x"}, {ID: "good", Body: "y"}, {ID: "bad", Body: "x"}}
			outcomes := make([]dedup.Outcome, len(msgs))
			require.NoError(t, w.HandleBatch(context.Background(), msgs, func(i int, res dedup.Result, err error) bool {
				require.NoError(t, err)
				outcomes[i] = res.Outcome
				return true
			}))
			require.Equal(t, []dedup.Outcome{dedup.OutcomeRetry, dedup.OutcomeProcessed, dedup.OutcomeRetry}, outcomes)
			retried := logs.warnings("dedup: handler panicked; will retry")
			require.Len(t, retried, 1)
			requirePanicStack(t, retried[0]["stack"], "dedup_test.panicInHandler", 8<<10)
		})
	}
}

// The transactional inbox dead-letters a panic with its stack too.
func TestPanicStackInTxLetter(t *testing.T) {
	store := newPostgresStore(t, testenv.Postgres(t))
	sink, logs := dedup.NewMemorySink(), &logRecords{}
	w, err := dedup.WrapTx(store, events, func(ctx context.Context, tx pgx.Tx, e event) error {
		panicInHandler(e.ID)
		return nil
	}, fastOpts(t, sink, dedup.WithMaxAttempts(1), dedup.WithLogger(slog.New(logs)))...)
	require.NoError(t, err)
	res := deadLettered(t, w, "tx-panic")
	require.Equal(t, dedup.ReasonPanic, res.Reason)
	requirePanicStack(t, sink.Letters()[0].Stack, "dedup_test.panicInHandler", 2<<10)
	parked := logs.warnings("dedup: message dead-lettered")
	require.Len(t, parked, 1)
	requirePanicStack(t, parked[0]["stack"], "dedup_test.panicInHandler", 8<<10)
}

// A letter for anything but a panic has no stack and no dedup-stack.
func TestLetterWithoutPanicHasNoStack(t *testing.T) {
	sink := dedup.NewMemorySink()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(ctx context.Context, e event) error {
		return dedup.Permanent(fmt.Errorf("schema v9 unsupported"))
	}, fastOpts(t, sink)...)
	require.NoError(t, err)
	deadLettered(t, w, "perm")
	dl := sink.Letters()[0]
	require.Empty(t, dl.Stack)
	for _, h := range dl.Metadata() {
		require.NotEqual(t, "dedup-stack", h.Key)
	}
}
