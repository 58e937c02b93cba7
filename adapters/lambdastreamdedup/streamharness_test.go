package lambdastreamdedup_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adaptertest"
)

// Settings of the event source mapping the harness plays.
const (
	// batchSize is the mapping's BatchSize.
	batchSize = 10
	// invocationTimeout is the function's timeout: the deadline of each
	// invocation's context.
	invocationTimeout = time.Minute
	// idle is how long a consumer waits when no shard has records for it.
	idle = 20 * time.Millisecond
)

// streamKind is what the harness needs to know of one kind of stream
// record R and its Lambda handler.
type streamKind[R any] struct {
	shards   int // 0: 2
	messages dedup.Messages[R]
	// record returns the record of m put to shard with sequence number seq.
	record   func(shard int, seq string, m adaptertest.Message) R
	sequence func(R) string
	read     func(R) adaptertest.Message
	// invoke runs the handler over w for one batch and returns the
	// sequence numbers of its batch item failures.
	invoke func(ctx context.Context, w *dedup.Wrapper[R], batch []R) ([]string, error)
	// letterPayload returns the suite's payload from a dead letter.
	letterPayload func(dedup.DeadLetter) ([]byte, error)
	// sameRecord: a copy of an ID already published (with the same
	// payload) is the same record again, with its sequence number.
	sameRecord bool
}

// streamShard is one shard: its records and its checkpoint, and the lock
// an invocation holds, since a mapping invokes one batch per shard at a
// time.
type streamShard[R any] struct {
	invoking sync.Mutex
	mu       sync.Mutex
	records  []R
	pos      int
}

// streamHarness is the suite's view of a stream played in process: its
// shards, and the in-memory dead-letter sink every consumer's wrapper has.
type streamHarness[R any] struct {
	kind   streamKind[R]
	shards []*streamShard[R]
	sink   *dedup.MemorySink

	mu   sync.Mutex
	seq  int
	seen map[string]string // sequence number by ID and payload (sameRecord)
}

func newStreamHarness[R any](kind streamKind[R]) *streamHarness[R] {
	n := kind.shards
	if n == 0 {
		n = 2
	}
	h := &streamHarness[R]{kind: kind, sink: dedup.NewMemorySink(), seen: map[string]string{}}
	for range n {
		h.shards = append(h.shards, &streamShard[R]{})
	}
	return h
}

// Publish appends each message to the shard its ID hashes to, with the
// next sequence number of the stream.
func (h *streamHarness[R]) Publish(_ *testing.T, msgs ...adaptertest.Message) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range msgs {
		key := m.ID + "\x00" + string(m.Payload)
		seq, ok := h.seen[key]
		if !ok || !h.kind.sameRecord {
			h.seq++
			seq = sequenceNumber(h.seq)
			h.seen[key] = seq
		}
		i := shardOf(m.ID, len(h.shards))
		s := h.shards[i]
		s.mu.Lock()
		s.records = append(s.records, h.kind.record(i, seq, m))
		s.mu.Unlock()
	}
}

// NewConsumer returns a consumer playing the event source mapping for a
// function running the kind's handler over cfg's wrapper.
func (h *streamHarness[R]) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	w := adaptertest.Wrap(t, cfg, h.kind.messages, h.sink, h.kind.read)
	return &streamConsumer[R]{t: t, h: h, w: w, shutdown: cfg.ShutdownTimeout}
}

// DeadLetters returns the letters the wrappers sent to the sink.
func (h *streamHarness[R]) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	var out []adaptertest.Letter
	for _, dl := range h.sink.Letters() {
		payload, err := h.kind.letterPayload(dl)
		if err != nil {
			t.Fatalf("dead letter of %s: %v", dl.EventID, err)
		}
		meta := map[string]string{}
		for _, hd := range dl.Metadata() {
			meta[hd.Key] = string(hd.Value)
		}
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		out = append(out, adaptertest.Letter{EventID: meta["dedup-event-id"], Reason: dedup.Reason(meta["dedup-reason"]),
			Attempts: attempts, Payload: payload, Metadata: meta})
	}
	return out
}

// Unsettled counts the records after the shards' checkpoints.
func (h *streamHarness[R]) Unsettled(*testing.T) int {
	n := 0
	for _, s := range h.shards {
		s.mu.Lock()
		n += len(s.records) - s.pos
		s.mu.Unlock()
	}
	return n
}

// BreakConnection is never called: the harness has no connection.
func (h *streamHarness[R]) BreakConnection(t *testing.T) func() {
	t.Fatal("a stream played in process has no connection to break")
	return nil
}

// streamConsumer is one function's share of the event source mapping: it
// invokes the handler with each shard's next batch no other invocation
// holds.
type streamConsumer[R any] struct {
	t        *testing.T
	h        *streamHarness[R]
	w        *dedup.Wrapper[R]
	shutdown time.Duration
}

// Run invokes batches until ctx is done, waiting briefly whenever no
// checkpoint moved (nothing new, or a batch failed at its first record); an
// invocation running when ctx is done goes on for the shutdown timeout
// before its context is canceled.
func (c *streamConsumer[R]) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		moved := false
		for _, s := range c.h.shards {
			if ctx.Err() == nil && s.invoking.TryLock() {
				moved = c.invoke(ctx, s) || moved
				s.invoking.Unlock()
			}
		}
		if !moved {
			select {
			case <-ctx.Done():
			case <-time.After(idle):
			}
		}
	}
	return nil
}

// invoke runs the handler over the batch after s's checkpoint, if any, and
// moves the checkpoint to the first batch item failure or past the batch;
// it reports whether the checkpoint moved. s.invoking is held.
func (c *streamConsumer[R]) invoke(ctx context.Context, s *streamShard[R]) bool {
	s.mu.Lock()
	batch := slices.Clone(s.records[s.pos:min(s.pos+batchSize, len(s.records))])
	s.mu.Unlock()
	if len(batch) == 0 {
		return false
	}
	inv, cancel := context.WithTimeout(context.WithoutCancel(ctx), invocationTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.shutdown, cancel)
		context.AfterFunc(inv, func() { t.Stop() })
	})
	defer stop()
	failed, err := c.h.kind.invoke(inv, c.w, batch)
	if err != nil {
		c.t.Errorf("the handler returned %v: Lambda retries the whole batch", err)
		return false
	}
	done := len(batch)
	switch len(failed) {
	case 0:
	case 1:
		// The first of the batch: a record put again keeps its sequence
		// number (sameRecord), and the first copy has not settled.
		done = slices.IndexFunc(batch, func(r R) bool { return c.h.kind.sequence(r) == failed[0] })
		if done < 0 {
			c.t.Errorf("batch item failure %q names no record of the batch", failed[0])
			return false
		}
	default:
		c.t.Errorf("%d batch item failures for one shard: %v", len(failed), failed)
		return false
	}
	s.mu.Lock()
	s.pos += done
	s.mu.Unlock()
	return done > 0
}

// Health is the wrapper's.
func (c *streamConsumer[R]) Health() error { return c.w.Health() }
