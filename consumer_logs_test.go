package dedup_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/testenv"
)

// parcel is a delivery as RabbitMQ would hand it over: an event ID (empty:
// none) and its delivery tag.
type parcel struct {
	ID  string
	Tag uint64
}

// parcels reads parcels as amqpdedup reads deliveries of queue "payments";
// built counts the dead letters built.
func parcels(built *atomic.Int64) dedup.Messages[parcel] {
	return dedup.Messages[parcel]{
		EventID: func(p parcel) (string, error) {
			if p.ID == "" {
				return "", errors.New("no message_id property")
			}
			return p.ID, nil
		},
		Payload: func(p parcel) []byte { return []byte("{}") },
		DeadLetter: func(p parcel) dedup.DeadLetter {
			built.Add(1)
			return dedup.DeadLetter{Payload: []byte("{}"), Origin: dedup.Origin{Queue: "payments",
				RoutingKey: "payments.refund", DeliveryTag: p.Tag, MessageID: p.ID}}
		},
	}
}

// The retry and dead-letter lines name the key as scope/id, unquoted even
// though the scope holds a '/', and the message by its transport's
// coordinates (here RabbitMQ's queue, exchange, routing key, delivery tag
// and message ID), a message without an ID too.
func TestRetryAndLetterLogsNameTheMessage(t *testing.T) {
	logs := testenv.NewJSONLogs(t)
	var built atomic.Int64
	w, err := dedup.Wrap(dedup.NewMemoryStore(), parcels(&built), func(context.Context, parcel) error {
		return errors.New("card declined")
	}, dedup.WithScope(dedup.Scope("order-payments", "record-payment")), dedup.WithSink(dedup.NewMemorySink()),
		dedup.WithMaxAttempts(2), dedup.WithLogger(logs.Logger(slog.LevelDebug)))
	require.NoError(t, err)
	ctx := context.Background()
	origin := func(tag float64, id string) map[string]any {
		o := map[string]any{"queue": "payments", "exchange": "", "routing_key": "payments.refund", "delivery_tag": tag}
		if id != "" {
			o["message_id"] = id
		}
		return o
	}

	res, err := w.Handle(ctx, parcel{ID: "evt_1", Tag: 7})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeRetry, res.Outcome)
	retried := logs.Lines("dedup: attempt failed, will retry")
	require.Len(t, retried, 1, logs.String())
	require.Equal(t, "order-payments/record-payment/evt_1", retried[0]["key"])
	require.Equal(t, origin(7, "evt_1"), retried[0]["origin"])

	res, err = w.Handle(ctx, parcel{ID: "evt_1", Tag: 8})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeDeadLettered, res.Outcome)
	res, err = w.Handle(ctx, parcel{Tag: 9})
	require.NoError(t, err)
	require.Equal(t, dedup.ReasonInvalidID, res.Reason)

	parked := logs.Lines("dedup: message dead-lettered")
	require.Len(t, parked, 2, logs.String())
	require.Equal(t, "order-payments/record-payment/evt_1", parked[0]["key"])
	require.Equal(t, string(dedup.ReasonHandlerError), parked[0]["reason"])
	require.Equal(t, origin(8, "evt_1"), parked[0]["origin"])
	require.Equal(t, string(dedup.ReasonInvalidID), parked[1]["reason"])
	require.Equal(t, origin(9, ""), parked[1]["origin"], "a message without an ID is named by its coordinates")
}

// The retry line's origin is built only when the line is written: at INFO,
// a retry builds no dead letter.
func TestRetryLogBuildsNoOriginWhenOff(t *testing.T) {
	logs := testenv.NewJSONLogs(t)
	var built atomic.Int64
	w, err := dedup.Wrap(dedup.NewMemoryStore(), parcels(&built), func(context.Context, parcel) error {
		return errors.New("card declined")
	}, dedup.WithScope("order-payments"), dedup.WithSink(dedup.NewMemorySink()), dedup.WithLogger(logs.Logger(slog.LevelInfo)))
	require.NoError(t, err)
	res, err := w.Handle(context.Background(), parcel{ID: "evt_2", Tag: 1})
	require.NoError(t, err)
	require.Equal(t, dedup.OutcomeRetry, res.Outcome)
	require.Zero(t, built.Load(), "dead letters built for a retry logged at DEBUG with DEBUG off")
	require.Empty(t, logs.String())
}

// Each transport's origin is logged by the coordinates it names a message
// by, empty fields left out.
func TestOriginLogValue(t *testing.T) {
	for name, tc := range map[string]struct {
		origin dedup.Origin
		want   map[string]any
	}{
		"kafka": {dedup.Origin{Topic: "payments", Partition: 3, Offset: 42, Group: "billing"},
			map[string]any{"topic": "payments", "partition": 3.0, "offset": 42.0, "group": "billing"}},
		"sqs": {dedup.Origin{QueueURL: "http://sqs/q", MessageID: "m-1"},
			map[string]any{"queue_url": "http://sqs/q", "message_id": "m-1"}},
		"rabbitmq": {dedup.Origin{Queue: "payments", Exchange: "events", RoutingKey: "pay", DeliveryTag: 5},
			map[string]any{"queue": "payments", "exchange": "events", "routing_key": "pay", "delivery_tag": 5.0}},
		"nats": {dedup.Origin{Topic: "orders.created", Stream: "ORDERS", Offset: 17, Group: "billing", MessageID: "e1"},
			map[string]any{"stream": "ORDERS", "subject": "orders.created", "sequence": 17.0, "consumer": "billing", "message_id": "e1"}},
	} {
		t.Run(name, func(t *testing.T) {
			logs := testenv.NewJSONLogs(t)
			logs.Logger(slog.LevelInfo).Info("m", slog.Any("origin", tc.origin))
			lines := logs.Lines("m")
			require.Len(t, lines, 1)
			require.Equal(t, tc.want, lines[0]["origin"])
		})
	}
}
