package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
)

// gauge returns the value of the int64 gauge name for scope, and whether
// the collection had it.
func (tel *telemetry) gauge(t *testing.T, name, scope string) (int64, bool) {
	var rm metricdata.ResourceMetrics
	require.NoError(t, tel.reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			data, ok := m.Data.(metricdata.Gauge[int64])
			if !ok || m.Name != name {
				continue
			}
			for _, p := range data.DataPoints {
				if v, _ := p.Attributes.Value("dedup.scope"); v.AsString() == scope {
					return p.Value, true
				}
			}
		}
	}
	return 0, false
}

// dedup.outage is 0 while the wrapper is healthy, 1 once a failing
// dead-letter sink has made an outage of its deliveries (as Health says),
// and 0 again once a letter is taken.
func TestOutageGauge(t *testing.T) {
	tel, sink := newTelemetry(t), deduptest.NewFailingSink()
	w, err := dedup.Wrap(dedup.NewMemoryStore(), events, func(context.Context, event) error {
		return dedup.Permanent(errors.New("unsupported"))
	}, dedup.WithScope("outage-gauge"), dedup.WithSink(sink), dedup.WithMeterProvider(tel.mp),
		dedup.WithOutageThreshold(100*time.Millisecond))
	require.NoError(t, err)
	v, ok := tel.gauge(t, "dedup.outage", "outage-gauge")
	require.True(t, ok, "dedup.outage is observed before any delivery")
	require.Equal(t, int64(0), v, "a wrapper that has handled nothing is in no outage")

	sink.FailWith(errors.New("dlq down"))
	msg := event{ID: "p", Body: "x"}
	for deadline := time.Now().Add(30 * time.Second); w.Health() == nil; time.Sleep(20 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "no outage after 30 s of a failing sink")
		_, err := w.Handle(context.Background(), msg)
		require.Error(t, err, "a dead letter the sink refused is not settled")
	}
	require.ErrorIs(t, w.Health(), dedup.ErrOutage)
	v, _ = tel.gauge(t, "dedup.outage", "outage-gauge")
	require.Equal(t, int64(1), v, "dedup.outage during the outage")

	sink.FailWith(nil)
	require.Equal(t, dedup.OutcomeDeadLettered, deliverUntilSettled(t, w, msg).Outcome)
	require.NoError(t, w.Health())
	v, _ = tel.gauge(t, "dedup.outage", "outage-gauge")
	require.Equal(t, int64(0), v, "dedup.outage after the sink took the letter")
	require.Len(t, sink.Letters(), 1)
}
