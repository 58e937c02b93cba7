package outbox

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"time"

	"github.com/dedupkit/dedup"
)

// Event is one message to publish, written by [Outbox.Add] in the caller's
// transaction and handed to a [Publisher] by the [Relay].
type Event struct {
	// ID identifies the event end to end: it travels with the message and is
	// what consumers deduplicate on. Leave it empty to get a UUIDv7 from
	// [NewID]; set it to an ID of your own (at most dedup.MaxIDLen bytes of
	// UTF-8 text without control characters) that never depends on fields
	// which change between retries.
	ID string
	// Destination is the Kafka topic or the SQS queue (URL or name).
	Destination string
	// Key is the Kafka record key, or the SQS FIFO message group. Events with
	// the same destination and key are published in commit order; events
	// without a key are published in no particular order.
	Key []byte
	// Headers become Kafka record headers or SQS message attributes.
	Headers []Header
	// Payload is the message body; it must not be empty.
	Payload []byte
	// Tenant, when set, is sent in the "tenant" header or attribute.
	Tenant string
	// Attempts is how many times the relay has tried to publish the event
	// before; Add ignores it.
	Attempts int
}

// Header is one Kafka record header or SQS message attribute of an [Event].
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// NewID returns a new UUIDv7 (RFC 9562) as a string: a millisecond timestamp
// followed by 74 random bits. IDs made in a later millisecond sort after
// earlier ones; publication order does not depend on it.
func NewID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // crypto/rand.Read never returns an error
	binary.BigEndian.PutUint64(u[:8], uint64(time.Now().UnixMilli())<<16|uint64(binary.BigEndian.Uint16(u[6:8])))
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // variant 10
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], u[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], u[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], u[8:10])
	s[23] = '-'
	hex.Encode(s[24:], u[10:])
	return string(s[:])
}

// check returns why e cannot be written, or "".
func (e *Event) check() string {
	switch {
	case e.Destination == "":
		return "empty destination"
	case len(e.Payload) == 0:
		return "empty payload"
	}
	if err := (dedup.Key{Scope: "outbox", EventID: e.ID}).Validate(); err != nil {
		if ke, ok := errors.AsType[*dedup.KeyError](err); ok {
			return ke.Reason
		}
		return err.Error()
	}
	for _, h := range e.Headers {
		if h.Key == "" {
			return "header with an empty name"
		}
	}
	return ""
}
