package redisstore

import (
	"context"
	"fmt"
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
