package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A TTL shorter than the lease (WithLease, else 30 s) is refused by every
// engine with an error naming both: a record would expire while its claim
// is held, and a duplicate after it would run again. A TTL as long as the
// lease is accepted.
func TestTTLShorterThanLeaseIsRefused(t *testing.T) {
	store, sink := newPostgresStore(t, testenv.Postgres(t)), dedup.NewMemorySink()
	h := func(context.Context, event) error { return nil }
	txh := func(context.Context, pgx.Tx, event) error { return nil }
	engines := map[string]func(opts ...dedup.Opt) error{
		"Wrap": func(opts ...dedup.Opt) error {
			_, err := dedup.Wrap(store, events, h, append(opts, dedup.WithScope("s"), dedup.WithSink(sink))...)
			return err
		},
		"WrapTx": func(opts ...dedup.Opt) error {
			_, err := dedup.WrapTx(store, events, txh, append(opts, dedup.WithScope("s"), dedup.WithSink(sink))...)
			return err
		},
		"NewFront": func(opts ...dedup.Opt) error {
			_, err := dedup.NewFront(store, runWork, opts...)
			return err
		},
		"NewTxFront": func(opts ...dedup.Opt) error {
			_, err := dedup.NewTxFront(store, testenv.Postgres(t), func(context.Context, pgx.Tx, txWork) error { return nil }, opts...)
			return err
		},
	}
	for name, build := range engines {
		t.Run(name, func(t *testing.T) {
			err := build(dedup.WithTTL(time.Second))
			require.ErrorIs(t, err, dedup.ErrConfig)
			require.ErrorContains(t, err, "WithTTL(1s) is shorter than the lease (30s by default)")

			err = build(dedup.WithLease(2*time.Minute), dedup.WithTTL(time.Minute))
			require.ErrorIs(t, err, dedup.ErrConfig)
			require.ErrorContains(t, err, "WithTTL(1m0s) is shorter than the lease (WithLease(2m0s))")

			require.NoError(t, build(dedup.WithTTL(30*time.Second)), "a TTL as long as the default lease")
			require.NoError(t, build(dedup.WithLease(time.Second), dedup.WithTTL(time.Second)), "a TTL as long as the lease")
			require.NoError(t, build(dedup.WithLease(time.Hour)), "the default TTL, 7 days, over a lease of an hour")
		})
	}
}

// WithTxPerEvent is for WrapTx only: Wrap refuses it with an error that
// names it and the constructor that honours it, where it used to ignore it.
func TestWithTxPerEventIsForWrapTxOnly(t *testing.T) {
	store, sink := newPostgresStore(t, testenv.Postgres(t)), dedup.NewMemorySink()
	_, err := dedup.Wrap(store, events, func(context.Context, event) error { return nil },
		dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithTxPerEvent())
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.ErrorContains(t, err, "Wrap cannot honour WithTxPerEvent (only WrapTx does)")

	_, err = dedup.WrapTx(store, events, func(context.Context, pgx.Tx, event) error { return nil },
		dedup.WithScope("s"), dedup.WithSink(sink), dedup.WithTxPerEvent())
	require.NoError(t, err)
}

// Every option refused by a constructor is named in the one error, each
// with who honours it.
func TestRefusedOptionsAreNamedTogether(t *testing.T) {
	_, err := dedup.NewFront(dedup.NewMemoryStore(), runWork, dedup.WithScope("s"), dedup.WithTxPerEvent())
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.ErrorContains(t, err,
		"a front end's engine cannot honour WithScope (only Wrap and WrapTx do), WithTxPerEvent (only WrapTx does)")
}
