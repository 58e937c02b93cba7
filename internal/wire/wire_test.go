package wire

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// The NATS ID header is JetStream's, which this package may not import.
func TestNATSIDHeaderIsJetStreams(t *testing.T) {
	if NATSIDHeader != jetstream.MsgIDHeader {
		t.Fatalf("NATSIDHeader is %q, JetStream's message ID header %q", NATSIDHeader, jetstream.MsgIDHeader)
	}
}
