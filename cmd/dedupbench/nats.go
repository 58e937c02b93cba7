package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/natsdedup"
	"github.com/dedupkit/dedup/deduptype"
)

// natsIDHeader is the header the NATS rows' events carry their IDs in. Not
// Nats-Msg-Id, natsdedup's default: JetStream would drop every re-send
// within its duplicate window, and the stream would hold none of the
// duplicates the other rows' consumers meet (redeliveries, and re-sends
// after the window, are what the wrapper catches).
const natsIDHeader = "event-id"

// runNATSNone pulls the stream's messages from a durable pull consumer,
// natsdedup's default batch at a time, and acknowledges each (Ack, which
// the server does not confirm), with no dedup: what JetStream and nats.go
// cost on their own.
func runNATSNone(ctx context.Context, cfg config, m *meter) error {
	_, cons, drop, err := openStream(ctx, cfg, m)
	if err != nil {
		return err
	}
	defer drop()
	m.begin()
	m.started()
	for ctx.Err() == nil {
		batch, err := cons.Fetch(natsdedup.DefaultBatchSize, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return ctxOr(ctx, err)
		}
		var n int64
		for msg := range batch.Messages() {
			if err := msg.Ack(); err != nil {
				return ctxOr(ctx, err)
			}
			n++
		}
		if err := batch.Error(); err != nil {
			return ctxOr(ctx, err)
		}
		m.settle(dedup.OutcomeProcessed, n)
	}
	return nil
}

// runNATS consumes the stream through natsdedup.Consumer with its defaults
// over PostgreSQL: pulls of up to 50 messages, each claimed in one store
// call and completed together, acknowledged with DoubleAck. Its letters
// would go to a memory sink, so no dead-letter stream is checked.
func runNATS(ctx context.Context, cfg config, m *meter) error {
	js, cons, drop, err := openStream(ctx, cfg, m)
	if err != nil {
		return err
	}
	defer drop()
	w, closeStore, err := wrapPostgres(ctx, cfg, m, "nats", natsdedup.Messages(natsdedup.WithIDHeader(natsIDHeader)))
	if err != nil {
		return err
	}
	defer closeStore()
	c, err := natsdedup.NewConsumer(cons, w, natsdedup.WithJetStream(js), natsdedup.WithDeadLetterSubjects(nil))
	if err != nil {
		return err
	}
	m.begin()
	m.started()
	return c.Run(ctx)
}

// openStream creates a stream of its own (file storage, JetStream's
// default), fills it with the row's events and returns a durable pull
// consumer of it with explicit acknowledgements, and a function that
// deletes the stream and closes the connection.
func openStream(ctx context.Context, cfg config, m *meter) (jetstream.JetStream, jetstream.Consumer, func(), error) {
	nc, err := nats.Connect(cfg.NATS, nats.Name("dedupbench"))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("NATS at %s: %w (run `make services`)", cfg.NATS, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	token := deduptype.NewOwnerToken()[:12]
	name, subject := "DEDUPBENCH_"+token, "dedupbench."+token
	m.queue = name
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
	if err != nil {
		nc.Close()
		return nil, nil, nil, fmt.Errorf("create stream %s: %w", name, err)
	}
	drop := func() {
		_ = js.DeleteStream(context.Background(), name)
		nc.Close()
	}
	if err := publishNATS(ctx, js, stream, subject, cfg); err != nil {
		drop()
		return nil, nil, nil, err
	}
	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "dedupbench", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
	})
	if err != nil {
		drop()
		return nil, nil, nil, fmt.Errorf("create a consumer of %s: %w", name, err)
	}
	return js, cons, drop, nil
}

// publishNATS publishes the row's events in eventOrder to subject, each
// with its ID in natsIDHeader, and waits until the stream has acknowledged
// them all and holds them. (publishAll's window is below nats.go's limit
// of pending async publishes, 4,000, beyond which a publish stalls and may
// fail.)
func publishNATS(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, subject string, cfg config) error {
	err := publishAll(eventOrder(cfg.Records, cfg.Unique), func(i int) (func() error, error) {
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: eventBody(i), Header: nats.Header{natsIDHeader: {eventID(i)}}})
		if err != nil {
			return nil, fmt.Errorf("publish events to %s: %w", subject, err)
		}
		return func() error {
			select {
			case <-f.Ok():
				return nil
			case err := <-f.Err():
				return fmt.Errorf("publish events to %s: %w", subject, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}, nil
	})
	if err != nil {
		return err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs != uint64(cfg.Records) {
		return fmt.Errorf("stream %s holds %d messages, want %d", info.Config.Name, info.State.Msgs, cfg.Records)
	}
	return nil
}
