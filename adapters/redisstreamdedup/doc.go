// Package redisstreamdedup runs the entries of a Redis stream, read by a
// consumer group, through a dedup.Wrapper, so that each event has one
// effect however often the group delivers it, and parks poison entries in
// a dead-letter stream.
//
// It has three parts:
//
//   - [Messages] tells a dedup.Wrapper how to read a *[Message] (an entry
//     with its stream, group and delivery count): the event ID from the
//     "id" field (or another, [WithIDField], or the entry ID,
//     [WithEntryID]), the "payload" field as the payload, and the delivery
//     count of the group's pending entry list as the transport's attempt
//     count.
//   - [Consumer] reads with XREADGROUP in bounded batches (COUNT, BLOCK),
//     acknowledges (XACK) only once an entry is settled, gives entries back
//     for a retry by setting their idle time, keeps held entries from being
//     taken over with a heartbeat, takes over the pending entries of a
//     consumer that died with XAUTOCLAIM once they are idle for the claim
//     idle time ([WithClaimIdle], the store lease too: the store fences the
//     takeover), shuts down gracefully, and reports an outage of the store,
//     the sink or Redis ([Consumer.Health], [WithMaxOutage]).
//   - [Sink] is a dedup.Sink that adds dead letters to a stream (XADD),
//     the origin stream's key + ":dlq" by default, with the SDK's dedup-*
//     metadata fields.
//
// Trimming is left to the user: neither the Consumer nor the Sink trims a
// stream (MAXLEN, MINID). Trim the stream no further than the entries
// every group has acknowledged (XINFO GROUPS), and the dead-letter stream
// as letters are dealt with; an entry trimmed while pending cannot be
// handled, and the Consumer logs it when XAUTOCLAIM drops it.
//
// A worker:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	rdb.XGroupCreateMkStream(ctx, "orders", "billing", "$") // once
//	sink, _ := redisstreamdedup.NewSink(rdb) // letters to "orders:dlq"
//	w, _ := dedup.Wrap(store, redisstreamdedup.Messages(), charge,
//		dedup.WithScope(dedup.Scope("billing", "charge")), dedup.WithSink(sink))
//	c, _ := redisstreamdedup.NewConsumer(rdb, "orders", "billing", w)
//	err := c.Run(ctx) // until ctx is cancelled
package redisstreamdedup
