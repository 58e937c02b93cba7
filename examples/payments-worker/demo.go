package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The demo's load.
const (
	demoPayments     = 200 // each published twice
	demoRefundRacers = 20  // concurrent requests of one refund, one key
	demoRefunds      = 10  // other refunds, each sent twice
)

// runDemo publishes payments (each twice) and one poison message, sends
// refunds (one key from many goroutines at once, others twice each), waits
// until the worker has settled everything, and checks each effect
// happened once.
func runDemo(ctx context.Context, wk *worker, base string) error {
	if err := publishPayments(ctx, wk.cfg); err != nil {
		return err
	}
	answers, err := sendRefunds(base)
	if err != nil {
		return err
	}
	if err := sameAnswers(answers); err != nil {
		return err
	}
	events := demoPayments + 1 + demoRefunds
	if err := waitSettled(ctx, wk, events); err != nil {
		return err
	}
	fmt.Printf("payments: %d published twice, recorded once each; 1 poison message in %s.dlq\n", demoPayments, wk.cfg.queue)
	fmt.Printf("refunds: %d requests with one key answered alike, %d others sent twice; %d refunds recorded\n",
		demoRefundRacers, demoRefunds, demoRefunds+1)
	fmt.Printf("events: %d on stream %s, one each\n", events, wk.cfg.stream)
	return readiness(base)
}

// publishPayments publishes each payment twice, as a publisher retrying
// after a lost confirm would, and one message that is not a payment.
func publishPayments(ctx context.Context, cfg config) error {
	conn, err := amqp.Dial(cfg.rabbitmq)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	publish := func(id, body string) error {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", cfg.queue, true, false, amqp.Publishing{
			MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
		})
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish %s: not confirmed (%v)", id, err)
		}
		return nil
	}
	for round := range 2 {
		for i := range demoPayments {
			if err := publish(fmt.Sprintf("pay-%d", i), fmt.Sprintf(`{"amount":%d}`, 100+i)); err != nil {
				return err
			}
		}
		if round == 0 {
			if err := publish("pay-poison", "not a payment"); err != nil {
				return err
			}
		}
	}
	return nil
}

// answer is an HTTP response as the demo compares them.
type answer struct {
	status int
	body   string
}

// sendRefunds sends one refund from demoRefundRacers goroutines at once
// under one key, then demoRefunds others twice each, and returns the
// racers' answers.
func sendRefunds(base string) ([]answer, error) {
	post := func(key, body string) (answer, error) {
		req, err := http.NewRequest(http.MethodPost, base+"/refunds", strings.NewReader(body))
		if err != nil {
			return answer{}, err
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return answer{resp.StatusCode, string(b)}, err
	}
	racerKey := rand.Text() // a key per operation, hard to guess
	answers := make([]answer, demoRefundRacers)
	errs := make([]error, demoRefundRacers)
	var wg sync.WaitGroup
	for i := range demoRefundRacers {
		wg.Go(func() { answers[i], errs[i] = post(racerKey, `{"payment":"pay-0","amount":5}`) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	for i := range demoRefunds {
		body := fmt.Sprintf(`{"payment":"pay-%d","amount":%d}`, i+1, i+1)
		key := rand.Text()
		for range 2 {
			a, err := post(key, body)
			if err != nil {
				return nil, err
			}
			if a.status != http.StatusCreated {
				return nil, fmt.Errorf("%w: refund %d answered %d %s", errDemo, i, a.status, a.body)
			}
		}
	}
	return answers, nil
}

// sameAnswers checks that every racer got the one refund's answer.
func sameAnswers(answers []answer) error {
	for _, a := range answers {
		if a != answers[0] || a.status != http.StatusCreated {
			return fmt.Errorf("%w: one key answered both %d %q and %d %q", errDemo, answers[0].status, answers[0].body, a.status, a.body)
		}
	}
	return nil
}

// counts is what the demo watches settle.
type counts struct{ payments, refunds, letters, events int }

func (wk *worker) counts(ctx context.Context) (counts, error) {
	var c counts
	err := wk.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM example_worker_payments),
		(SELECT count(*) FROM example_worker_refunds)`).Scan(&c.payments, &c.refunds)
	if err != nil {
		return c, err
	}
	conn, err := amqp.Dial(wk.cfg.rabbitmq)
	if err != nil {
		return c, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return c, err
	}
	q, err := ch.QueueDeclarePassive(wk.cfg.queue+".dlq", true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		return c, err
	}
	c.letters = q.Messages
	s, err := wk.js.Stream(ctx, wk.cfg.stream)
	if err != nil {
		return c, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return c, err
	}
	c.events = int(info.State.Msgs)
	return c, nil
}

// stall is how long the demo waits without any count moving before it
// gives up: the worker is not keeping up, it is stuck.
const stall = 2 * time.Minute

// waitSettled waits until every payment, refund, letter and event is
// there and every payment's second copy was answered as a duplicate, as
// long as the counts keep moving; none may be there twice meanwhile.
func waitSettled(ctx context.Context, wk *worker, events int) error {
	want := counts{payments: demoPayments, refunds: demoRefunds + 1, letters: 1, events: events}
	var last counts
	var lastDuplicates int64
	moved := time.Now()
	for {
		c, err := wk.counts(ctx)
		if err != nil {
			return err
		}
		switch {
		case c.payments > want.payments || c.refunds > want.refunds || c.letters > want.letters || c.events > want.events:
			return fmt.Errorf("%w: applied twice: have %+v, want %+v", errDemo, c, want)
		case c == want && wk.duplicates.Load() >= demoPayments:
			return nil
		case c != last || wk.duplicates.Load() != lastDuplicates:
			last, lastDuplicates, moved = c, wk.duplicates.Load(), time.Now()
		case time.Since(moved) > stall:
			return fmt.Errorf("%w: nothing settled for %v: have %+v, want %+v", errDemo, stall, c, want)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readiness checks that /readyz reports every part ready.
func readiness(base string) error {
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: /readyz answered %d: %s", errDemo, resp.StatusCode, bytes.TrimSpace(b))
	}
	fmt.Println("/readyz: ok")
	return nil
}
