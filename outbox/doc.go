// Package outbox is the producing side of dedup: a transactional outbox.
//
// An application writes its business rows and the events describing them in
// one PostgreSQL transaction ([Outbox.Add]); a [Relay] publishes committed
// events to a broker through a [Publisher] and marks each one sent only after
// the broker acknowledged it. Delivery is at least once: a relay that dies
// after publishing and before marking publishes again. Every published message
// carries its event ID where the consumer adapters read it, so a consumer
// wrapped with dedup.Wrap or dedup.WrapTx applies each committed event
// exactly once, and its key, the one the outbox orders by:
//
//	broker          publisher    event ID               key
//	Kafka           kafkaoutbox  "event-id" header      the record's key
//	SQS             sqsoutbox    "event-id" attribute   the FIFO message group (a standard queue: none)
//	RabbitMQ        amqpoutbox   message_id property    "event-key" header
//	NATS JetStream  natsoutbox   "Nats-Msg-Id" header   "event-key" header (or "event-key-base64")
//
// The order promise. Events with the same destination and key are published
// in the order their transactions committed, with any number of relays and
// without any lock of the application's: Add serialises the writers of a
// key with a transaction-scoped advisory lock, so that within a key the
// order of the rows' sequence numbers is commit order (an event ID, even a
// UUIDv7, is not: a transaction can take its ID, then commit after one that
// took a later ID). A relay publishes a key only while it holds the key's
// relay lock (another advisory lock, for the length of its pass), and only
// events with no earlier event of their key still pending. An event waiting
// out its backoff holds its key back; an event failed for good (refused by
// the broker, or out of attempts) does not, and the key's later events go
// out without it. Delivery is at least once: a relay that dies after
// publishing and before marking publishes a batch again, each copy behind the
// first in its partition or FIFO group, and the consumer drops the copies.
// Events of different keys have no order between them. A sequence alone is
// not commit order (a lower number can commit later: Watermill's SQL
// forwarder lost such rows, its issue #311); the relays never move past a
// row, they take whatever is pending.
//
// The outbox is a PostgreSQL table, whatever store the consumers keep their
// records in (dedup.PostgresStore, dedup.DynamoDBStore, redisstore.Store or
// dedup.MemoryStore). The publishers live in subpackages (kafkaoutbox,
// sqsoutbox, amqpoutbox, natsoutbox), so that this package depends on no
// broker's SDK. [Relay.Health] reports whether the relay is publishing, for
// a readiness probe (dedup.ReadinessHandler).
package outbox
