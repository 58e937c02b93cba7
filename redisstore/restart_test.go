package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// TestRestartLosesWhatWasNotOnDisk counts what a Redis crash costs under
// each persistence setting: events are processed through a Wrapper, the
// server is killed (SIGKILL) and started again mid-run, then every event is
// delivered again. An event whose record the crash lost runs a second time.
//
// A process crash is measured here, not a machine crash: with appendfsync
// everysec, what Redis wrote to the AOF but had not yet fsynced survives a
// process kill (the kernel has it) and is lost, up to a second of writes,
// only when the machine goes down.
func TestRestartLosesWhatWasNotOnDisk(t *testing.T) {
	const events = 1000
	cases := []struct {
		name string
		args []string
		// lost is how many of the events processed before the crash run
		// again after it, or -1 when it is only counted: with everysec,
		// Redis postpones its AOF write while an fsync is slow, and answers
		// meanwhile, so a busy disk can lose acknowledged writes.
		lost int
	}{
		{"no persistence", nil, events / 2},
		{"AOF everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, -1},
		{"AOF always", []string{"--appendonly", "yes", "--appendfsync", "always"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := testenv.StartRedisServer(t, c.args...)
			store, err := New(srv.Client())
			require.NoError(t, err)
			var mu sync.Mutex
			runs := map[string]int{}
			w, err := dedup.Wrap(store, dedup.Messages[string]{
				EventID:    func(id string) (string, error) { return id, nil },
				Payload:    func(id string) []byte { return []byte(id) },
				DeadLetter: func(id string) dedup.DeadLetter { return dedup.DeadLetter{Payload: []byte(id)} },
			}, func(_ context.Context, id string) error {
				mu.Lock()
				defer mu.Unlock()
				runs[id]++
				return nil
			}, dedup.WithScope("restart"), dedup.WithSink(dedup.NewMemorySink()))
			require.NoError(t, err)

			// With everysec, a claim can survive the crash without its
			// completion (both acknowledged, the second not yet written):
			// the record is then in flight until its lease lapses.
			want := []dedup.Outcome{dedup.OutcomeProcessed, dedup.OutcomeDuplicate}
			if c.lost < 0 {
				want = append(want, dedup.OutcomeInFlight)
			}
			held := 0
			deliver := func(from, to int) {
				t.Helper()
				for i := from; i < to; i++ {
					res, err := w.Handle(t.Context(), fmt.Sprint("evt-", i))
					require.NoError(t, err)
					require.Contains(t, want, res.Outcome)
					if res.Outcome == dedup.OutcomeInFlight {
						held++
					}
				}
			}
			deliver(0, events/2)
			srv.Kill()
			srv.Start()
			deliver(0, events) // the first half again, then the rest

			twice := 0
			for i := range events {
				switch n := runs[fmt.Sprint("evt-", i)]; n {
				case 1:
				case 2:
					twice++
				default:
					t.Fatalf("evt-%d ran %d times", i, n)
				}
			}
			t.Logf("%s: %d of %d events acknowledged before the crash ran again after it, %d held by a claim whose completion was lost",
				c.name, twice, events/2, held)
			if c.lost >= 0 {
				require.Equal(t, c.lost, twice)
			}
		})
	}
}
