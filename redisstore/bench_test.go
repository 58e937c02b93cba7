package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// BenchmarkRedisClaimBatch claims size new keys per batch, one round trip;
// ns/event divides by size. The keys expire after a minute.
func BenchmarkRedisClaimBatch(b *testing.B) {
	s, err := New(testenv.Redis(b), WithKeyPrefix("bench:"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := deduptype.NewOwnerToken()[:8]
	for _, size := range []int{1, 10, 100, 500} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			reqs := make([]dedup.ClaimRequest, size)
			batches := 0
			for b.Loop() {
				batches++
				for j := range reqs {
					reqs[j] = dedup.ClaimRequest{Key: dedup.Key{Scope: "bench-" + run, EventID: fmt.Sprintf("b%d-%d-%d", size, batches, j)},
						Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute}
				}
				if _, err := s.ClaimBatch(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(batches*size), "ns/event")
		})
	}
}

// BenchmarkRedisCompleteBatch completes size held keys per batch (claimed
// outside the timer), one round trip.
func BenchmarkRedisCompleteBatch(b *testing.B) {
	s, err := New(testenv.Redis(b), WithKeyPrefix("bench:"))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := deduptype.NewOwnerToken()[:8]
	for _, size := range []int{1, 10, 100, 500} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			reqs := make([]dedup.ClaimRequest, size)
			cs := make([]deduptype.Completion, size)
			batches := 0
			for b.Loop() {
				b.StopTimer()
				batches++
				for j := range reqs {
					reqs[j] = dedup.ClaimRequest{Key: dedup.Key{Scope: "bench-" + run, EventID: fmt.Sprintf("c%d-%d-%d", size, batches, j)},
						Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute}
				}
				claims, err := s.ClaimBatch(ctx, reqs)
				if err != nil {
					b.Fatal(err)
				}
				for j, c := range claims {
					cs[j] = deduptype.Completion{Key: c.Record.Key, Owner: c.Record.Owner, TTL: time.Minute}
				}
				b.StartTimer()
				if _, err := s.CompleteBatch(ctx, cs); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(batches*size), "ns/event")
		})
	}
}

// BenchmarkRedisClaimReplay claims keys that are already settled or held,
// the claims that answer a retry: a succeeded key with a 300-byte result
// (ClaimDuplicate), a key another owner holds (ClaimInFlight), a key stored
// with another fingerprint (ClaimConflict). One round trip each.
func BenchmarkRedisClaimReplay(b *testing.B) {
	s, scope, result := benchStore(b, "bench-replay-")
	ctx := context.Background()
	for _, tc := range []struct {
		name, fp string
		settle   bool
		want     dedup.ClaimStatus
	}{
		{"duplicate", "fp", true, dedup.ClaimDuplicate},
		{"in-flight", "fp", false, dedup.ClaimInFlight},
		{"conflict", "other", true, dedup.ClaimConflict},
	} {
		b.Run(tc.name, func(b *testing.B) {
			k := dedup.Key{Scope: scope, EventID: tc.name + "-" + deduptype.NewOwnerToken()[:8]}
			c, err := s.Claim(ctx, dedup.ClaimRequest{Key: k, Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			if tc.settle {
				if err := s.Complete(ctx, k, c.Record.Owner, result, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
			req := dedup.ClaimRequest{Key: k, Fingerprint: tc.fp, Lease: time.Minute, TTL: time.Minute}
			b.ReportAllocs()
			for b.Loop() {
				c, err := s.Claim(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if c.Status != tc.want {
					b.Fatalf("%v, want %v", c.Status, tc.want)
				}
			}
		})
	}
}

// BenchmarkRedisClaimNew claims a new key and completes it with a 300-byte
// result, one caller at a time: a new key's two round trips.
func BenchmarkRedisClaimNew(b *testing.B) {
	s, scope, result := benchStore(b, "bench-new-")
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		k := dedup.Key{Scope: scope, EventID: strconv.Itoa(i)}
		c, err := s.Claim(ctx, dedup.ClaimRequest{Key: k, Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute})
		if err != nil || c.Status != dedup.ClaimAcquired {
			b.Fatal(c.Status, err)
		}
		if err := s.Complete(ctx, k, c.Record.Owner, result, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// benchStore returns a store for a claim benchmark, a scope of its own
// named from prefix, and a 300-byte result to complete keys with.
func benchStore(b *testing.B, prefix string) (*Store, string, []byte) {
	s, err := New(testenv.Redis(b), WithKeyPrefix("bench:"))
	if err != nil {
		b.Fatal(err)
	}
	result := make([]byte, 300)
	for i := range result {
		result[i] = 'a' + byte(i%26)
	}
	return s, prefix + deduptype.NewOwnerToken()[:8], result
}
