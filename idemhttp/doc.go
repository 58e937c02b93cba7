// Package idemhttp is net/http middleware for the Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header-07) over any dedup.Store:
// dedup.MemoryStore (one process, tests), dedup.PostgresStore,
// dedup.DynamoDBStore and redisstore.Store.
//
// A client makes one key per logical operation and sends it on every retry,
// as a Structured Field string:
//
//	Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//
// The same key without quotes, as clients written for other APIs send it,
// is accepted as the same key.
//
// The middleware claims the key atomically in the store, runs the handler
// once, stores its status, chosen headers and body, and answers every retry
// with that same response, marked with the [ReplayHeader]. A retry that
// arrives while the first request runs gets 409 with Retry-After; a key
// reused for another request (method, route, query or body) gets 422; a missing or
// bad key gets 400. Errors are RFC 9457 problem documents whose type names
// the case (see [Problem]). docs/http.md has the full table.
//
// Keys are bound to the caller with [WithTenant]. The response is buffered
// until it is stored, so handlers cannot stream: Flush does nothing until
// the response outgrows the snapshot limit (and is then streamed, not
// stored); http.ResponseController's deadlines reach the connection.
//
// On PostgreSQL, [NewTx] runs the handler in the transaction that holds the
// key and stores the response, so the handler's rows and the stored answer
// commit together, and with them the events the handler writes to the
// transactional outbox (outbox.Add), which a relay publishes to Kafka, SQS,
// RabbitMQ or NATS JetStream.
//
// Both middlewares report an outage of their store in Health, for a
// readiness probe (dedup.ReadinessHandler), and record spans and the
// idemhttp.requests metric when given providers ([WithTracerProvider],
// [WithMeterProvider]); docs/operations.md lists their logs.
//
// Each middleware keeps the settled answers it stored or replayed lately in
// process ([WithReplayCache], 8 MiB by default), keyed as the store keys
// them: a retry of one is answered, or refused if its request changed,
// without a store call, never past the record's expiry nor, after a record
// is deleted by hand, past [WithReplayCacheMaxAge] (30 s).
package idemhttp
