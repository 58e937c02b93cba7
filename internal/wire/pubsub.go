package wire

// PubSubIDAttribute is the Google Cloud Pub/Sub message attribute carrying
// the event ID that the outbox publisher writes; the consumer reads it with
// pubsubdedup.WithIDAttribute (by default it reads the server's message
// ID, which a producer's retried publish changes).
const PubSubIDAttribute = "event-id"
