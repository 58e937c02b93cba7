package outbox_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/outbox"
	"github.com/dedupkit/dedup/outbox/kafkaoutbox"
)

// A relay is ready once a pass succeeded, and says why it is not: not
// running, a database unreachable since it started (after the threshold,
// not before), or the error that stopped it.
func TestRelayHealth(t *testing.T) {
	e := newEnv(t, 1)
	r := e.relay()
	if err := r.Health(); !errors.Is(err, dedup.ErrOutage) || !strings.Contains(err.Error(), "not running") {
		t.Fatalf("before Run: %v", err)
	}
	e.start(r)
	waitFor(t, 30*time.Second, "a running relay's readiness", func() bool { return r.Health() == nil })
	srv := httptest.NewServer(dedup.ReadinessHandler(r))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz of a running relay: %d", resp.StatusCode)
	}

	pub, err := kafkaoutbox.NewPublisher(e.producer())
	if err != nil {
		t.Fatal(err)
	}
	unreachable := func(threshold time.Duration) *outbox.Relay {
		cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/test?connect_timeout=5")
		if err != nil {
			t.Fatal(err)
		}
		r, err := outbox.NewRelay(e.ob, cfg, pub, outbox.WithOutageThreshold(threshold), outbox.WithLogger(quietLogger()))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	patient, quick := unreachable(time.Hour), unreachable(time.Millisecond)
	e.start(patient, quick)
	// Within its threshold a relay that has not passed yet is starting.
	waitFor(t, 30*time.Second, "the patient relay running", func() bool { return patient.Health() == nil })
	waitFor(t, 30*time.Second, "an unreachable database reported", func() bool {
		err := quick.Health()
		return err != nil && strings.Contains(err.Error(), "passes failing") // a pass failed, not only slow

	})
	if err := quick.Health(); !errors.Is(err, dedup.ErrOutage) || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("unreachable database: %v", err)
	}
	if err := patient.Health(); err != nil {
		t.Fatalf("within its threshold: %v", err)
	}

	// A database that refuses the relay for good stops Run; Health says why.
	cfg := e.pool.Config()
	cfg.ConnConfig.Database = "no_such_database_" + runID()
	stopped, err := outbox.NewRelay(e.ob, cfg, pub, outbox.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = stopped.Run(context.Background()) })
	wg.Wait()
	if err := stopped.Health(); !errors.Is(err, dedup.ErrOutage) || !strings.Contains(err.Error(), "stopped") ||
		!strings.Contains(err.Error(), "no_such_database_") {
		t.Fatalf("refused for good: %v", err)
	}
}
