package idemhttp

import "time"

// WithCacheClock sets the replay cache's clock, so that tests move time
// instead of waiting for it.
func WithCacheClock(now func() time.Time) Opt { return optFunc(func(c *config) { c.now = now }) }

// ReplayCacheStats returns the bytes the replay cache holds, as it counts
// them, and its number of entries.
func (f *front) ReplayCacheStats() (used, entries int) { return f.cache.stats() }
