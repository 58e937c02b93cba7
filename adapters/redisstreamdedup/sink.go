package redisstreamdedup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
)

// ErrNoDLQStream is returned by [Sink.Send] when no dead-letter stream can
// be named for a letter (one without an origin stream, under the default
// naming).
var ErrNoDLQStream = errors.New("redisstreamdedup: no dead-letter stream for this letter")

// DefaultDLQSuffix ends the dead-letter stream's key of a letter unless
// [WithDLQStream] names another: the origin stream's key followed by
// ":dlq".
const DefaultDLQSuffix = ":dlq"

// LetterIDField is the field of a letter identifying one dead-lettering of
// one entry, derived from the scope, the event ID and the origin (stream
// and entry ID): a letter sent again, after a failure to record it, is
// not added twice (see [Sink]).
const LetterIDField = dedup.MetadataPrefix + "letter-id"

// letterWindow is how many of the dead-letter stream's last entries are
// looked through for a letter sent already.
const letterWindow = 256

// addLetter adds a letter (ARGV[3:], field and value pairs) to KEYS[1]
// unless one of its last ARGV[1] entries has the letter's ID (ARGV[2]),
// and returns the entry ID of the letter.
var addLetter = redis.NewScript(`
local recent = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', ARGV[1])
for _, e in ipairs(recent) do
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == '` + LetterIDField + `' and f[i + 1] == ARGV[2] then return e[1] end
  end
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
`)

// Sink is a dedup.Sink that adds dead letters to a Redis stream (XADD), by
// default the origin stream's key followed by ":dlq", created by the first
// letter. A letter has the original entry's fields, its payload in the
// payload field ("payload", [WithDLQPayloadField]), followed by the dedup-*
// metadata (dedup.DeadLetter.HeadersWithMetadata; metadata from an earlier
// dead-lettering is replaced) and a [LetterIDField]: a letter sent again,
// after a failure to record it, is not added twice as long as fewer than
// 256 other letters came in between. The dead-letter stream is never
// trimmed by the Sink: trimming it is left to the user, as for every
// stream.
type Sink struct {
	rdb          redis.Scripter
	stream       func(origin string) string
	payloadField string
}

// SinkOpt configures a [Sink].
type SinkOpt interface{ apply(*Sink) }

type sinkOptFunc func(*Sink)

func (f sinkOptFunc) apply(x *Sink) { f(x) }

// WithDLQStream names the dead-letter stream of a letter from its origin
// stream's key; the default is origin + ":dlq". Returning "" refuses the
// letter with [ErrNoDLQStream].
func WithDLQStream(f func(origin string) string) SinkOpt {
	return sinkOptFunc(func(s *Sink) { s.stream = f })
}

// WithDLQPayloadField names the field a letter's payload is written to
// instead of "payload": the [WithPayloadField] of the [Messages] reading
// the entries, so that a letter moved back to its stream is read as its
// entry was.
func WithDLQPayloadField(name string) SinkOpt {
	return sinkOptFunc(func(s *Sink) { s.payloadField = name })
}

// NewSink returns a Sink adding letters with rdb, the caller's, who closes
// it.
func NewSink(rdb redis.Scripter, opts ...SinkOpt) (*Sink, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: redisstreamdedup.NewSink: nil Redis client", dedup.ErrConfig)
	}
	s := &Sink{rdb: rdb, stream: defaultDLQStream, payloadField: DefaultPayloadField}
	for _, o := range opts {
		o.apply(s)
	}
	switch {
	case s.stream == nil:
		return nil, fmt.Errorf("%w: redisstreamdedup.WithDLQStream: nil function", dedup.ErrConfig)
	case s.payloadField == "":
		return nil, fmt.Errorf("%w: redisstreamdedup.WithDLQPayloadField(\"\")", dedup.ErrConfig)
	}
	return s, nil
}

func defaultDLQStream(origin string) string {
	if origin == "" {
		return ""
	}
	return origin + DefaultDLQSuffix
}

// DLQStream returns the key of the dead-letter stream of letters from the
// stream origin, or "" when the Sink refuses them.
func (s *Sink) DLQStream(origin string) string { return s.stream(origin) }

// Send adds dl to its dead-letter stream and returns nil once Redis has
// stored it (or had stored it already: a letter sent again).
func (s *Sink) Send(ctx context.Context, dl dedup.DeadLetter) error {
	stream := s.stream(dl.Origin.Stream)
	if stream == "" {
		return fmt.Errorf("%w: %s/%s from stream %q", ErrNoDLQStream, dl.Scope, dl.EventID, dl.Origin.Stream)
	}
	id := letterID(&dl)
	args := []any{letterWindow, id}
	if dl.Payload != nil {
		args = append(args, s.payloadField, dl.Payload)
	}
	for _, h := range dl.HeadersWithMetadata() {
		if h.Key != s.payloadField {
			args = append(args, h.Key, h.Value)
		}
	}
	args = append(args, LetterIDField, id)
	if err := addLetter.Run(ctx, s.rdb, []string{stream}, args...).Err(); err != nil {
		return fmt.Errorf("redisstreamdedup: dead letter %s/%s to %s: %w", dl.Scope, dl.EventID, stream, err)
	}
	return nil
}

// letterID identifies one dead-lettering of one entry.
func letterID(dl *dedup.DeadLetter) string {
	o := dl.Origin
	h := sha256.New()
	for _, p := range []string{dl.Scope, dl.EventID, o.Stream, o.MessageID, strconv.Quote(o.Group)} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "dl-" + hex.EncodeToString(h.Sum(nil)[:16])
}
