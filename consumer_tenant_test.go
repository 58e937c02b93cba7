package dedup_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// tenantEvent is a message that names its tenant.
type tenantEvent struct {
	Tenant, ID, Body string
}

var tenantEvents = dedup.Messages[tenantEvent]{
	EventID:    func(e tenantEvent) (string, error) { return e.ID, nil },
	Tenant:     func(e tenantEvent) (string, error) { return e.Tenant, nil },
	Payload:    func(e tenantEvent) []byte { return []byte(e.Body) },
	DeadLetter: func(e tenantEvent) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(e.Body)} },
}

// TestTenantIsolation proves, on every store, that tenant A can never see,
// complete or replay tenant B's record for the same event ID.
func TestTenantIsolation(t *testing.T) {
	all := stores()
	all["dynamodb"] = func(t *testing.T) dedup.Store {
		client := testenv.DynamoDB(t)
		s, err := dedup.NewDynamoDBStore(client, dedup.WithTable(newDynamoDBTable(t, client)))
		require.NoError(t, err)
		return s
	}
	for name, newStore := range all {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			store, sink := newStore(t), dedup.NewMemorySink()
			var effects atomic.Int32
			w, err := dedup.Wrap(store, tenantEvents, func(ctx context.Context, e tenantEvent) error {
				effects.Add(1)
				if e.Body == "fail" {
					return errors.New("tenant B's handler fails")
				}
				return nil
			}, fastOpts(t, sink, dedup.WithLease(time.Minute))...)
			require.NoError(t, err)

			// The same event ID in both tenants: two events, two effects.
			res, err := w.Handle(ctx, tenantEvent{Tenant: "A", ID: "inv-1", Body: "ok"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeProcessed, res.Outcome)
			res, err = w.Handle(ctx, tenantEvent{Tenant: "B", ID: "inv-1", Body: "fail"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeRetry, res.Outcome, "A's success does not make B's event a duplicate")
			require.EqualValues(t, 2, effects.Load())

			keyA := dedup.Key{Scope: dedup.TenantScope(w.Scope(), "A"), EventID: "inv-1"}
			keyB := dedup.Key{Scope: dedup.TenantScope(w.Scope(), "B"), EventID: "inv-1"}
			recA, err := store.Get(ctx, keyA)
			require.NoError(t, err)
			recB, err := store.Get(ctx, keyB)
			require.NoError(t, err)
			require.Equal(t, dedup.StatusSucceeded, recA.Status)
			require.Equal(t, dedup.StatusFailedRetryable, recB.Status)

			// B claims its event; A's owner token cannot settle B's record.
			cB, err := store.Claim(ctx, dedup.ClaimRequest{Key: keyB, Fingerprint: recB.Fingerprint, Lease: time.Minute, TTL: time.Hour})
			require.NoError(t, err)
			require.Equal(t, dedup.ClaimAcquired, cB.Status)
			require.ErrorIs(t, store.Complete(ctx, keyB, recA.Owner, nil, time.Hour), dedup.ErrLeaseLost)
			require.ErrorIs(t, store.Complete(ctx, keyA, cB.Record.Owner, nil, time.Hour), dedup.ErrLeaseLost)
			got, err := store.Get(ctx, keyB)
			require.NoError(t, err)
			require.Equal(t, dedup.StatusProcessing, got.Status)
			require.Equal(t, cB.Record.Owner, got.Owner)

			// A replaying its event is A's duplicate, never B's.
			res, err = w.Handle(ctx, tenantEvent{Tenant: "A", ID: "inv-1", Body: "ok"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeDuplicate, res.Outcome)
			require.Equal(t, keyA, res.Key)

			// No tenant: never processed without dedup.
			res, err = w.Handle(ctx, tenantEvent{ID: "inv-1", Body: "ok"})
			require.NoError(t, err)
			require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
			require.Equal(t, dedup.ReasonInvalidID, res.Reason)
			require.EqualValues(t, 2, effects.Load())
		})
	}
}
