package redisstore

import (
	"testing"

	"github.com/dedupkit/dedup/deduptest"
	"github.com/dedupkit/dedup/internal/testenv"
)

func TestConformance(t *testing.T) {
	client := testenv.Redis(t)
	t.Run("single node", func(t *testing.T) {
		s, err := New(client, WithKeyPrefix("deduptest:"))
		if err != nil {
			t.Fatal(err)
		}
		deduptest.Run(t, s, deduptest.WithExpiryDeletes())
	})
	// The path a Cluster or Ring client takes (one script call per key),
	// run here on the single node.
	t.Run("sharded", func(t *testing.T) {
		s, err := New(client, WithKeyPrefix("deduptest:"))
		if err != nil {
			t.Fatal(err)
		}
		s.sharded = true
		deduptest.Run(t, s, deduptest.WithExpiryDeletes())
	})
}
