// Package wire holds the names a producer and a consumer of this module
// must agree on, per transport: the header or attribute an event's ID and
// tenant travel in. The outbox publishers write them and the consumer
// adapters read them; both import this package, so that neither imports
// the other. It imports nothing.
package wire

// The header or message attribute an event's ID travels in, by transport.
// (RabbitMQ carries it in the message's own MessageId property.)
const (
	// KafkaIDHeader is the Kafka record header carrying the event ID.
	KafkaIDHeader = "event-id"
	// SQSIDAttribute is the SQS message attribute carrying the event ID.
	SQSIDAttribute = "event-id"
	// NATSIDHeader is the NATS header carrying the event ID: JetStream's
	// own message ID (jetstream.MsgIDHeader), which its duplicate window
	// already checks on publish.
	NATSIDHeader = "Nats-Msg-Id"
)

// TenantHeader is the header, or the SQS message attribute, carrying an
// event's tenant, when it has one, on every transport.
const TenantHeader = "tenant"
