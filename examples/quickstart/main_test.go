package main

import (
	"context"
	"testing"
	"time"

	"github.com/dedupkit/dedup/internal/testenv"
)

// TestQuickstart runs the README's main command end to end at a smaller
// size: its own check (effects equal unique good events, dead letters equal
// poison events) decides the result.
func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, 2000, 0.2, 5, 4, "", "", false); err != nil {
		t.Fatal(err)
	}
}

// TestQuickstartRedis is the same with -redis.
func TestQuickstartRedis(t *testing.T) {
	testenv.Redis(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, 2000, 0.2, 5, 4, "", testenv.Env("DEDUP_REDIS_ADDR", testenv.DefaultRedisAddr), false); err != nil {
		t.Fatal(err)
	}
}
