// Package dedup makes event consumers safe under at-least-once delivery.
//
// A [Wrapper] sits between a transport (Kafka, SQS, ...) and a handler. For
// every delivery it claims the event's key in a [Store] with one atomic
// operation, runs the handler only when the claim was won, and records the
// outcome, so that one logical event has one business effect however often it
// arrives. A message that keeps failing is parked in a dead-letter [Sink]
// after a bounded number of attempts instead of looping forever.
//
// # Using it
//
// Pick a store ([NewPostgresStore], [NewDynamoDBStore], [NewMemoryStore] for
// tests; the redisstore package for Redis), then wrap a handler with [Wrap]
// (or [WrapTx], to run the handler in the PostgreSQL transaction that
// records it). [WithScope], built with [Scope], and [WithSink] are required;
// the other [Opt] values have defaults. The adapters/kafkadedup and
// adapters/sqsdedup packages run the poll loop and provide the [Messages]
// and the [Sink] for their transport. Each delivery's [Result] carries an
// [Outcome] (OutcomeProcessed, OutcomeDuplicate, ...) that says whether the
// transport may acknowledge it; [Wrapper.Health] tells a readiness probe
// whether the store or the sink keeps failing.
//
// # What the transactional inbox writes
//
// [WrapTx] writes one row an event, in the handler's own transaction, with
// four columns: the key (scope and event ID, the primary key, whose row
// lock is the attempt's lease while the transaction is open), the payload's
// fingerprint (so that a redelivery is a duplicate and a changed payload a
// conflict) and the expiry (so that [PostgresStore.Purge] can delete it).
// Status, attempts, owner and times are left NULL, which a committed inbox
// row means: succeeded, at its first attempt, nobody holding it. A failed
// attempt, whose writes are rolled back, records the rest: status, the
// attempt's owner token, attempts, error and times. The claim is one
// INSERT ... ON CONFLICT DO NOTHING; only a key a row holds is read and,
// when the state machine lets it, taken over by a second statement.
//
// # A key more than once in a batch
//
// HandleBatch and HandleConcurrent run a key once however often a batch
// holds it. A later copy with the same payload is answered from the first
// copy's outcome: OutcomeDuplicate once the first is settled (and, with
// batch completion, once its completion is written), else the first's own
// OutcomeRetry or OutcomeInFlight, so that it comes back too. A later copy
// with another payload is claimed on its own once the first settled, and
// the store judges it against the first's record (typically a conflict).
// The rule is the same whatever the store, the runner (claims up front, the
// inbox's shared transactions, one transaction per event) or the call.
//
// # When the store is down
//
// A handler that succeeded has had its effect; what remains is to record
// it. The wrapper keeps trying that completion, fenced on the claim's owner
// token, past the claim's lease, for as long as the delivery's context
// lives and up to ten leases: while nobody has taken the claim over, the
// owner's write is still the right one, and a store refuses it once
// somebody has. A transport must therefore cancel the context it passes
// once it may give the message to another consumer (the Kafka adapter when
// a partition is revoked, the SQS adapter at shutdown). Failed tries count
// toward the outage [Wrapper.Health] reports. When the wrapper gives up, it
// logs at ERROR that the effect may run again and counts
// dedup.outcomes_unrecorded ([WithMeterProvider]).
//
// # Which package is for whom
//
// This package is for users: everything a user's code names is declared
// or aliased here, including the vocabulary it shares with stores and
// adapters ([Key], [Record], [Status], [Outcome], [Result], [Reason],
// [Claim], the sentinel errors), which package deduptype declares so that
// a store, an adapter or a front end can name it without importing the
// wrapper. An alias is the same type or value under another name:
// errors.Is(err, dedup.ErrLeaseLost) matches deduptype.ErrLeaseLost.
//
// # Writing a store
//
// A new backend implements [Store] (and, to complete a batch in one write,
// deduptype.BatchCompleter); the deduptest package checks it against the
// contract. What only a store author needs is in package deduptype alone:
// Classify to answer a refused claim from the blocking record,
// MayTakeOver, ValidateBatch, ValidateCompletions, NewOwnerToken and
// NewOwnerTokens, and Completion. A transport adapter passes what it knows
// of a call's deliveries as [CallOpt] values ([CallLease], its redelivery
// deadline; [CallStop], its shutdown).
package dedup
