package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

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
	// RESP2 answers a script's false with nil where RESP3 answers false.
	t.Run("RESP2", func(t *testing.T) {
		opts := *client.Options()
		opts.Protocol = 2
		resp2 := redis.NewClient(&opts)
		t.Cleanup(func() { resp2.Close() })
		s, err := New(resp2, WithKeyPrefix("deduptest:"))
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

// TestCluster runs the suite on a real three-node Redis Cluster, through
// go-redis's ClusterClient: records spread over the nodes, batches are
// pipelined per node, one script call per key.
func TestCluster(t *testing.T) {
	var addrs []string
	for _, node := range testenv.StartRedisCluster(t, 3, 0) {
		addrs = append(addrs, node.Addr())
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { client.Close() })
	s, err := New(client)
	if err != nil {
		t.Fatal(err)
	}
	deduptest.Run(t, s, deduptest.WithExpiryDeletes())

	// The records landed on every node.
	ctx := t.Context()
	err = client.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		n, err := node.DBSize(ctx).Result()
		if err == nil && n == 0 {
			err = fmt.Errorf("node %s holds no record", node.Options().Addr)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
