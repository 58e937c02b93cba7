package wire

// The fields of a Redis stream entry an event's ID and payload travel in.
const (
	// RedisIDField is the field of a stream entry carrying the event ID.
	RedisIDField = "id"
	// RedisPayloadField is the field of a stream entry carrying the
	// payload.
	RedisPayloadField = "payload"
)
