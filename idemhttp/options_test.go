package idemhttp_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
)

// A TTL shorter than the lease (WithLease, default 30 s) is refused by New
// and NewTx with an error naming both: the key would be free again while
// its request runs. A TTL as long as the lease is accepted.
func TestTTLShorterThanLeaseIsRefused(t *testing.T) {
	store, pool := postgresStore(t)
	scope := idemhttp.WithScope("payments-api")
	build := map[string]func(opts ...idemhttp.Opt) error{
		"New": func(opts ...idemhttp.Opt) error {
			_, err := idemhttp.New(store, append(opts, scope)...)
			return err
		},
		"NewTx": func(opts ...idemhttp.Opt) error {
			_, err := idemhttp.NewTx(store, pool, append(opts, scope)...)
			return err
		},
	}
	for name, build := range build {
		t.Run(name, func(t *testing.T) {
			err := build(idemhttp.WithTTL(time.Second))
			require.ErrorIs(t, err, dedup.ErrConfig)
			require.ErrorContains(t, err, "WithTTL(1s) is shorter than the lease (30s)")
			require.NoError(t, build(idemhttp.WithTTL(30*time.Second)), "a TTL as long as the default lease")
		})
	}
	_, err := idemhttp.New(store, scope, idemhttp.WithLease(time.Minute), idemhttp.WithTTL(59*time.Second))
	require.ErrorIs(t, err, dedup.ErrConfig)
	require.ErrorContains(t, err, "WithTTL(59s) is shorter than the lease (1m0s)")
	_, err = idemhttp.New(store, scope, idemhttp.WithLease(time.Second), idemhttp.WithTTL(time.Second))
	require.NoError(t, err)
}

// NewTx refuses the options it would ignore, WithLease and
// WithWaitInFlight, naming them, where it used to accept them silently;
// New honours them.
func TestNewTxRefusesNewOnlyOptions(t *testing.T) {
	store, pool := postgresStore(t)
	scope := idemhttp.WithScope("payments-api")
	for name, opt := range map[string]idemhttp.Opt{
		"WithLease":        idemhttp.WithLease(time.Minute),
		"WithWaitInFlight": idemhttp.WithWaitInFlight(time.Second),
	} {
		t.Run(name, func(t *testing.T) {
			m, err := idemhttp.NewTx(store, pool, scope, opt)
			require.ErrorIs(t, err, dedup.ErrConfig)
			require.ErrorContains(t, err, "NewTx cannot honour "+name+" (only New does")
			require.Nil(t, m)
			_, err = idemhttp.New(store, scope, opt)
			require.NoError(t, err)
		})
	}
	_, err := idemhttp.NewTx(store, pool, scope, idemhttp.WithLease(time.Minute), idemhttp.WithWaitInFlight(time.Second))
	require.ErrorContains(t, err, "NewTx cannot honour WithLease, WithWaitInFlight (only New does")

	// The options both take are accepted, and the middleware serves.
	m, err := idemhttp.NewTx(store, pool, scope, idemhttp.WithTTL(time.Hour), idemhttp.WithRetryAfter(2*time.Second))
	require.NoError(t, err)
	srv := serve(t, m.Wrap(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) { w.WriteHeader(http.StatusCreated) }))
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", nil)
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "9f0c1d9e-2b4a-4c3e-8f7a-6d5b4c3a2b1c")
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)
}
