package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
	"github.com/dedupkit/dedup/internal/pubsubenv"
)

// pubsubPullWait bounds one pull of letters; a pull that brings none ends
// the redrive.
const pubsubPullWait = 5 * time.Second

// pubsubHold is the ack deadline a letter read but kept (skipped, or read
// in a dry run) is given while the redrive runs, so that it is not read
// twice; it is made available again at the end.
const pubsubHold = 600 * time.Second

// redrivePubSub sends the dead letters read from a subscription of a
// dead-letter topic back to the topics of the subscriptions they came from
// (dedup-origin-subscription): pull, publish, acknowledge. A letter is
// acknowledged only once the server stored its copy, so a redrive stopped
// halfway loses nothing; a letter skipped, or read in a dry run, is made
// available again at the end.
func redrivePubSub(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("redrive pubsub")
	project := fs.String("project", env("DEDUP_PUBSUB_PROJECT", ""), "Google Cloud project (DEDUP_PUBSUB_PROJECT) (required)")
	endpoint := fs.String("endpoint", env("DEDUP_PUBSUB_ENDPOINT", ""),
		"host:port of a Pub/Sub emulator, reached without TLS nor credentials (DEDUP_PUBSUB_ENDPOINT; the client also honours PUBSUB_EMULATOR_HOST)")
	sub := fs.String("subscription", "", "the subscription of the dead-letter topic to drain (required)")
	var r redrive
	if err := r.start(ctx, fs, args, "subscription"); err != nil {
		return err
	}
	defer r.close()
	if *project == "" {
		return fmt.Errorf("%w: -project is required", errUsage)
	}
	client, closeClient, err := pubsubClient(ctx, *project, *endpoint)
	if err != nil {
		return err
	}
	defer closeClient()
	p := &pubsubRedrive{r: &r, client: client, sub: client.Subscriber(*sub).String(),
		topics: map[string]*pubsub.Publisher{}, seen: map[string]bool{}}
	defer p.release(ctx)
	if _, err := client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: p.sub}); err != nil {
		return fmt.Errorf("subscription %s: %w", p.sub, err)
	}
	return drain(ctx, &r, out, func() ([]*pubsubpb.ReceivedMessage, error) { return p.pull(ctx) }, func(m *pubsubpb.ReceivedMessage) error { return p.letter(ctx, m, out) })
}

// pubsubClient returns a client of project, of the emulator at endpoint
// unless it is empty.
func pubsubClient(ctx context.Context, project, endpoint string) (*pubsub.Client, func(), error) {
	if endpoint == "" {
		c, err := pubsub.NewClient(ctx, project)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot reach Pub/Sub: %w", err)
		}
		return c, func() { _ = c.Close() }, nil
	}
	return pubsubenv.Dial(ctx, endpoint, project)
}

// pubsubRedrive is the state of one Pub/Sub redrive.
type pubsubRedrive struct {
	r      *redrive
	client *pubsub.Client
	sub    string                       // the dead-letter subscription's full name
	topics map[string]*pubsub.Publisher // by origin subscription
	seen   map[string]bool              // message IDs read
	kept   []string                     // ack IDs of the letters left
}

// pull reads the next letters, none once a pull brings none or only
// letters read already.
func (p *pubsubRedrive) pull(ctx context.Context) ([]*pubsubpb.ReceivedMessage, error) {
	pctx, cancel := context.WithTimeout(ctx, pubsubPullWait)
	defer cancel()
	res, err := p.client.SubscriptionAdminClient.Pull(pctx, &pubsubpb.PullRequest{Subscription: p.sub, MaxMessages: 100})
	if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pull from %s: %w", p.sub, err)
	}
	var fresh []*pubsubpb.ReceivedMessage
	for _, m := range res.GetReceivedMessages() {
		if id := m.GetMessage().GetMessageId(); !p.seen[id] {
			p.seen[id] = true
			fresh = append(fresh, m)
		} else {
			p.kept = append(p.kept, m.GetAckId())
		}
	}
	return fresh, nil
}

// letter redrives or skips one dead letter.
func (p *pubsubRedrive) letter(ctx context.Context, m *pubsubpb.ReceivedMessage, out io.Writer) error {
	r := p.r
	r.sum.read++
	msg := m.GetMessage()
	attrs := msg.GetAttributes()
	l := readLetter("message "+msg.GetMessageId(), func(name string) string { return attrs[name] })
	l.origin = attrs[pubsubdedup.OriginSubscriptionAttribute]
	keep := func(err error) error {
		p.kept = append(p.kept, m.GetAckId())
		return errors.Join(err, p.hold(ctx, m.GetAckId()))
	}
	var topic *pubsub.Publisher
	if l.origin != "" {
		var err error
		if topic, err = p.topicOf(ctx, l.origin); err != nil {
			return keep(err)
		}
	}
	dest := "subscription " + l.origin
	if topic != nil {
		dest = "topic " + topic.String() + " (" + dest + ")"
	}
	if send, err := r.admit(ctx, l, dest, out); !send {
		return keep(err)
	}
	back := &pubsub.Message{Data: msg.GetData(), OrderingKey: msg.GetOrderingKey(), Attributes: map[string]string{}}
	for name, v := range attrs {
		// The original's message ID stays: a consumer reading the event ID
		// from the message ID reads it from there.
		if !strings.HasPrefix(name, dedup.MetadataPrefix) && name != redriveCountHeader || name == pubsubdedup.OriginMessageIDAttribute {
			back.Attributes[name] = v
		}
	}
	back.Attributes[redriveCountHeader] = strconv.Itoa(l.redrives + 1)
	if _, err := topic.Publish(ctx, back).Get(ctx); err != nil {
		if back.OrderingKey != "" {
			topic.ResumePublish(back.OrderingKey)
		}
		return keep(fmt.Errorf("send %s back to %s: %w", l.key, dest, err))
	}
	r.sum.sent++
	if err := p.client.SubscriptionAdminClient.Acknowledge(context.WithoutCancel(ctx),
		&pubsubpb.AcknowledgeRequest{Subscription: p.sub, AckIds: []string{m.GetAckId()}}); err != nil {
		return fmt.Errorf("sent %s back but could not acknowledge it on %s (a second redrive sends it again, and the consumer's dedup answers it): %w",
			l.key, p.sub, err)
	}
	return nil
}

// topicOf returns a publisher of the topic subscription sub reads.
func (p *pubsubRedrive) topicOf(ctx context.Context, sub string) (*pubsub.Publisher, error) {
	if t, ok := p.topics[sub]; ok {
		return t, nil
	}
	s, err := p.client.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: sub})
	if err != nil {
		return nil, fmt.Errorf("origin subscription %s: %w", sub, err)
	}
	t := p.client.Publisher(s.GetTopic())
	t.EnableMessageOrdering = true
	p.topics[sub] = t
	return t, nil
}

// hold keeps a letter from being read again while the redrive runs.
func (p *pubsubRedrive) hold(ctx context.Context, ackID string) error {
	err := p.client.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pubsubpb.ModifyAckDeadlineRequest{
		Subscription: p.sub, AckIds: []string{ackID}, AckDeadlineSeconds: int32(pubsubHold / time.Second)})
	if err != nil {
		return fmt.Errorf("hold a letter of %s: %w", p.sub, err)
	}
	return nil
}

// release makes the letters left available again and stops the
// publishers.
func (p *pubsubRedrive) release(ctx context.Context) {
	if len(p.kept) > 0 {
		_ = p.client.SubscriptionAdminClient.ModifyAckDeadline(context.WithoutCancel(ctx), &pubsubpb.ModifyAckDeadlineRequest{
			Subscription: p.sub, AckIds: p.kept, AckDeadlineSeconds: 0})
	}
	for _, t := range p.topics {
		t.Stop()
	}
}
