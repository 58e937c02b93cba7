package dedup_test

import (
	"testing"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/deduptest"
)

func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) { deduptest.Run(t, dedup.NewMemoryStore()) })
}
