package redisstreamdedup_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/redisstreamdedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// The consumer passes the adapter conformance suite on Redis Streams: a
// stream of its own with a consumer group, a 2 s claim idle time, the
// stream's ":dlq" stream as the dead-letter destination, and a TCP proxy
// between the consumers' client and Redis, cut as a broken connection,
// which Health reports. The client is the harness's: its idle connections
// (the proxy's goroutines serving them) outlive a Run by design.
func TestConformance(t *testing.T) {
	adaptertest.Run(t, adaptertest.Features{HealthCoversBroker: true, IgnoreGoroutines: []string{
		"github.com/dedupkit/dedup/internal/testenv.(*Proxy).serve",
		"github.com/dedupkit/dedup/internal/testenv.(*Proxy).serve.func1",
	}}, newRedisHarness)
}

// redisHarness is the suite's view of one stream, its group and its
// dead-letter stream.
type redisHarness struct {
	e     *env
	rdb   *redis.Client // through proxy
	proxy *testenv.Proxy
	sink  *redisstreamdedup.Sink
}

func newRedisHarness(t *testing.T) adaptertest.Harness {
	e := newEnv(t)
	proxy, rdb := e.proxied(t)
	return &redisHarness{e: e, rdb: rdb, proxy: proxy, sink: e.sink(t)}
}

// Publish adds each message as an entry: its ID in "id", its payload in
// "payload", its headers as more fields.
func (h *redisHarness) Publish(t *testing.T, msgs ...adaptertest.Message) {
	t.Helper()
	for _, m := range msgs {
		fields := []string{"id", m.ID, "payload", string(m.Payload)}
		for k, v := range m.Headers {
			fields = append(fields, k, v)
		}
		h.e.publish(t, fields...)
	}
}

func (h *redisHarness) NewConsumer(t *testing.T, cfg adaptertest.Config) adaptertest.Consumer {
	t.Helper()
	w := adaptertest.Wrap(t, cfg, redisstreamdedup.Messages(), h.sink, func(m *redisstreamdedup.Message) adaptertest.Message {
		msg := adaptertest.Message{ID: eventID(m), Payload: []byte(field(m, "payload")), Headers: map[string]string{}}
		for k := range m.Values {
			if k != "id" && k != "payload" {
				msg.Headers[k] = field(m, k)
			}
		}
		return msg
	})
	c, err := redisstreamdedup.NewConsumer(h.rdb, h.e.stream, h.e.group, w, redisstreamdedup.WithBlock(time.Second),
		redisstreamdedup.WithClaimIdle(2*time.Second), redisstreamdedup.WithInFlightDelay(time.Second),
		redisstreamdedup.WithShutdownTimeout(cfg.ShutdownTimeout), redisstreamdedup.WithLogger(adaptertest.Logger(t)))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// DeadLetters reads the dead-letter stream.
func (h *redisHarness) DeadLetters(t *testing.T) []adaptertest.Letter {
	t.Helper()
	var out []adaptertest.Letter
	for _, l := range h.e.letters(t) {
		meta := map[string]string{}
		for k, v := range l.Values {
			meta[k], _ = v.(string)
		}
		attempts, _ := strconv.Atoi(meta["dedup-attempts"])
		out = append(out, adaptertest.Letter{EventID: meta["dedup-event-id"],
			Reason: dedup.Reason(meta["dedup-reason"]), Attempts: attempts, Payload: []byte(meta["payload"]), Metadata: meta})
	}
	return out
}

// Unsettled counts the group's entries not delivered yet or not
// acknowledged.
func (h *redisHarness) Unsettled(t *testing.T) int { return h.e.unsettled(t) }

// BreakConnection cuts the proxy: the consumers' connections are closed,
// and new ones refused until restored.
func (h *redisHarness) BreakConnection(t *testing.T) (restore func()) {
	t.Helper()
	h.proxy.Cut()
	return h.proxy.Restore
}
