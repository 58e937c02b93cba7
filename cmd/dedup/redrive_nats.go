package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupkit/dedup"
)

// redriveNATS sends the dead letters of a JetStream stream back to the
// subjects they came from. It reads the letters the stream held when it
// started by sequence, without a consumer, so a dry run changes nothing,
// and deletes a letter from the stream once JetStream acknowledged its copy
// on the origin subject. Deleting, not acknowledging a consumer's delivery,
// is what removes a letter whatever the stream's retention: a dead-letter
// stream usually keeps its messages under limits, where an ack removes
// nothing and a second redrive would send the letter again.
func redriveNATS(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive nats")
	url := fs.String("nats", env("DEDUP_NATS_URL", nats.DefaultURL), "NATS server URL (DEDUP_NATS_URL)")
	dlq := fs.String("dlq", "", "the dead-letter stream to drain, the one capturing dlq.> (required)")
	subject := fs.String("subject", ">", "only the letters on this subject of the stream, wildcards allowed, such as dlq.orders.>")
	var r redrive
	if err := r.start(ctx, fs, args, "dlq"); err != nil {
		return err
	}
	defer r.close()
	nc, err := nats.Connect(*url, nats.Name("dedup redrive"))
	if err != nil {
		return fmt.Errorf("cannot reach NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	stream, err := js.Stream(ctx, *dlq)
	if err != nil {
		return fmt.Errorf("stream %s: %w", *dlq, err)
	}
	state := stream.CachedInfo().State
	// Letters stored after the start, sent back and parked again among
	// them, wait for the next run.
	seq, last := max(state.FirstSeq, 1), state.LastSeq
	next := func() ([]*jetstream.RawStreamMsg, error) {
		if seq > last {
			return nil, nil
		}
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(*subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) || err == nil && m.Sequence > last {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s@%d: %w", *dlq, seq, err)
		}
		seq = m.Sequence + 1
		return []*jetstream.RawStreamMsg{m}, nil
	}
	return drain(ctx, &r, out, next, func(m *jetstream.RawStreamMsg) error {
		sent, err := r.natsLetter(ctx, js, *dlq, m, out)
		if !sent || err != nil {
			return err
		}
		if err := stream.DeleteMsg(context.WithoutCancel(ctx), m.Sequence); err != nil {
			return fmt.Errorf("sent %s@%d back but could not delete it (a second redrive sends it again, and the consumer's dedup answers it): %w",
				*dlq, m.Sequence, err)
		}
		return nil
	})
}

// natsLetter redrives or skips one dead letter; sent reports that the
// origin stream stored its copy.
func (r *redrive) natsLetter(ctx context.Context, js jetstream.JetStream, dlq string, m *jetstream.RawStreamMsg, out io.Writer) (sent bool, err error) {
	r.sum.read++
	header := func(name string) string { return m.Header.Get(name) }
	l := readLetter(fmt.Sprintf("%s@%d", dlq, m.Sequence), header)
	l.origin = header("dedup-origin-topic")
	if send, err := r.admit(ctx, l, "subject "+l.origin, out); !send {
		return false, err
	}
	back := &nats.Msg{Subject: l.origin, Data: m.Data, Header: nats.Header{}}
	for name, vs := range m.Header {
		// The sink's Nats-Msg-Id is the letter's own; the original's is
		// dedup-origin-message-id.
		if !strings.HasPrefix(name, dedup.MetadataPrefix) && !strings.HasPrefix(strings.ToLower(name), "nats-") && name != redriveCountHeader {
			back.Header[name] = vs
		}
	}
	back.Header.Set(redriveCountHeader, strconv.Itoa(l.redrives+1))
	var opts []jetstream.PublishOpt
	if id := header("dedup-origin-message-id"); id != "" {
		opts = append(opts, jetstream.WithMsgID(id)) // the event ID, unless the consumer reads another header
	}
	if s := header("dedup-origin-stream"); s != "" {
		opts = append(opts, jetstream.WithExpectStream(s)) // the stream its consumer reads, or an error
	}
	ack, err := js.PublishMsg(ctx, back, opts...)
	if err != nil {
		return false, fmt.Errorf("send %s back to subject %s: %w", l.key, l.origin, err)
	}
	if ack.Duplicate {
		// The origin stream dropped the copy: it still holds the original
		// message ID in its duplicate window. The letter stays.
		r.sum.skip("the origin stream "+ack.Stream+" drops its message ID as a duplicate (its Duplicates window): run again after it", l.where)
		return false, nil
	}
	r.sum.sent++
	return true, nil
}
