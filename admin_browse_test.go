package dedup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dedupkit/dedup/internal/testenv"
)

// seedBrowse writes, through the store's own operations, n records per
// scope of each kind the console lists: failed for good, stuck in flight
// (a lapsed lease), failed retryably, held by a live lease, succeeded. It
// returns the keys of the failed-final and the stuck ones.
func seedBrowse(t *testing.T, s Store, scopes []string, n int) (final, stuck map[Key]bool) {
	t.Helper()
	ctx := context.Background()
	final, stuck = map[Key]bool{}, map[Key]bool{}
	claim := func(k Key, lease time.Duration) Claim {
		c, err := s.Claim(ctx, ClaimRequest{Key: k, Fingerprint: "fp", Lease: lease, TTL: time.Hour})
		if err != nil || c.Status != ClaimAcquired {
			t.Fatalf("claim %s: %v %v", k, c.Status, err)
		}
		return c
	}
	for _, scope := range scopes {
		for i := range n {
			k := Key{Scope: scope, EventID: fmt.Sprintf("final-%03d", i)}
			c := claim(k, time.Hour)
			if err := s.Fail(ctx, k, c.Record.Owner, Failure{Final: true, Error: fmt.Sprintf("reason %d", i%3), TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			final[k] = true
			k = Key{Scope: scope, EventID: fmt.Sprintf("lapsed-%03d", i)}
			claim(k, time.Microsecond) // lapsed by the time the lists are read
			stuck[k] = true
			k = Key{Scope: scope, EventID: fmt.Sprintf("retry-%03d", i)}
			c = claim(k, time.Hour)
			if err := s.Fail(ctx, k, c.Record.Owner, Failure{Error: "later", TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			stuck[k] = true
			claim(Key{Scope: scope, EventID: fmt.Sprintf("live-%03d", i)}, time.Hour)
			k = Key{Scope: scope, EventID: fmt.Sprintf("done-%03d", i)}
			c = claim(k, time.Hour)
			if err := s.Complete(ctx, k, c.Record.Owner, nil, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
	}
	return final, stuck
}

// walk pages through q's list and returns every key it met, failing on one
// met twice or out of keyset order.
func walk(t *testing.T, b Browser, q BrowseQuery) map[Key]bool {
	t.Helper()
	seen := map[Key]bool{}
	var last *Record
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatal("paging does not end")
		}
		page, err := b.Browse(context.Background(), q)
		if err != nil {
			t.Fatal(err)
		}
		for i := range page {
			rec := page[i]
			if seen[rec.Key] {
				t.Fatalf("%s met twice", rec.Key)
			}
			if last != nil && !(&BrowseCursor{UpdatedAt: last.UpdatedAt, Key: last.Key}).after(&rec) {
				t.Fatalf("%s (%s) comes after %s (%s)", rec.Key, rec.UpdatedAt, last.Key, last.UpdatedAt)
			}
			seen[rec.Key] = true
			last = &rec
		}
		if len(page) < q.Limit {
			return seen
		}
		c := CursorOf(page[len(page)-1])
		q.After = &c
	}
}

// testBrowsePaging checks that paging walks each list's records exactly
// once, with ties in the sort key (tie makes many records share one
// update time), and that the filters keep what they say.
func testBrowsePaging(t *testing.T, s interface {
	Store
	Browser
}, tie func(t *testing.T)) {
	final, stuck := seedBrowse(t, s, []string{"a", "b", "c"}, 9)
	tie(t)
	equal := func(what string, got, want map[Key]bool) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: walked %d records, want %d", what, len(got), len(want))
		}
		for k := range want {
			if !got[k] {
				t.Errorf("%s: %s not walked", what, k)
			}
		}
	}
	for _, limit := range []int{1, 4, 100} {
		equal("final", walk(t, s, BrowseQuery{List: ListFailedFinal, Limit: limit}), final)
		equal("stuck", walk(t, s, BrowseQuery{List: ListStuck, Limit: limit}), stuck)
	}
	want := map[Key]bool{}
	for k := range final {
		if k.Scope == "b" && k.EventID[len(k.EventID)-1]%3 == '1'%3 {
			want[k] = true
		}
	}
	equal("final in b for reason 1", walk(t, s, BrowseQuery{List: ListFailedFinal, Scope: "b", Reason: "reason 1", Limit: 2}), want)
	if _, err := s.Browse(context.Background(), BrowseQuery{List: 9, Limit: 1}); err == nil {
		t.Error("an unknown list was answered")
	}
}

func TestMemoryBrowsePaging(t *testing.T) {
	s := NewMemoryStore()
	testBrowsePaging(t, s, func(t *testing.T) {
		s.mu.Lock()
		defer s.mu.Unlock()
		at := time.Now().Add(-time.Hour).UnixNano()
		i := 0
		for _, m := range s.records.all() {
			m.updatedAt = at + int64(i%4)*int64(time.Microsecond)
			i++
		}
	})
}

func TestPostgresBrowsePaging(t *testing.T) {
	s := newTestPostgresStore(t, testenv.Postgres(t))
	if err := s.CreateConsoleIndexes(context.Background()); err != nil {
		t.Fatal(err)
	}
	testBrowsePaging(t, s, func(t *testing.T) {
		if _, err := s.pool.Exec(context.Background(), `UPDATE `+s.table+` SET updated_at = date_trunc('hour', now()) - interval '1 hour' + (ascii(right(event_id, 1)) % 4) * interval '1 microsecond'`); err != nil {
			t.Fatal(err)
		}
	})
}
