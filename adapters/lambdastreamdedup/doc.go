// Package lambdastreamdedup makes AWS Lambda handlers for Kinesis Data
// Streams and DynamoDB Streams run each event once, with the stream
// semantics of partial batch responses, and parks poison records.
//
// A stream's event source mapping retries a batch from the sequence number a
// handler reports, in shard order. [KinesisHandler] and [DynamoDBHandler]
// run a batch's records in order, each shard's on its own. A record that
// does not settle (the handler failed and will be retried, or another
// invocation holds the event) is waited for in place, for the wrapper's
// backoff, and run again, as a Kafka partition waits, while the invocation
// has time left ([InPlaceReserve]); once it has not, the shard stops there:
// that record's sequence number is the one batch item failure the shard
// reports. Lambda then
// invokes again with that record and every one after it; the records of the
// retried batch that were already done answer as duplicates and are not run
// again. With BisectBatchOnFunctionError, the halves Lambda retries are
// answered the same way. A record that keeps failing is dead-lettered after
// dedup.WithMaxAttempts attempts to the wrapper's sink (for example an SQS
// queue through sqsdedup.NewSink), with its shard and sequence number in
// the letter, and the stream moves on.
//
// The event source mapping must have FunctionResponseTypes set to
// ReportBatchItemFailures; its MaximumRetryAttempts (and
// MaximumRecordAgeInSeconds) must allow at least MaxAttempts invocations of
// a failing record, or Lambda discards it first.
//
// [KinesisMessages] reads a Kinesis record: the event ID is its partition key
// and sequence number (or a JSON field of its data, [WithIDField]), the
// payload its data. [DynamoDBMessages] reads a DynamoDB Streams record: the
// event ID is its eventID, the payload its change (keys and images).
package lambdastreamdedup
