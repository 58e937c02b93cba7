// Package amqpconn opens the RabbitMQ connections of amqpdedup and
// amqpoutbox.
package amqpconn

import (
	"fmt"
	"maps"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultConfig is how a connection is made unless the user says otherwise:
// a 10 s heartbeat, so that a dead peer is noticed within 20 s.
func DefaultConfig() amqp.Config {
	return amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US"}
}

// Dial connects to url with cfg, naming the connection name (as the
// management UI shows it) unless cfg names it.
func Dial(url string, cfg amqp.Config, name string) (*amqp.Connection, error) {
	props := amqp.Table{"connection_name": name}
	maps.Copy(props, cfg.Properties)
	cfg.Properties = props
	return amqp.DialConfig(url, cfg)
}

// Confirmed is a connection with one channel in confirm mode, opened when
// first needed and again after it is lost. It is not safe for concurrent
// use: its user publishes one batch at a time, so that the channel's returns
// are that batch's.
type Confirmed struct {
	url  string
	cfg  amqp.Config
	name string

	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

// NewConfirmed returns a Confirmed connecting to url with cfg.
func NewConfirmed(url string, cfg amqp.Config, name string) *Confirmed {
	return &Confirmed{url: url, cfg: cfg, name: name}
}

// Channel returns the open confirm channel, opening it first if need be,
// and the channel its mandatory messages are returned on, which the caller
// must keep reading while it waits for confirmations.
func (c *Confirmed) Channel() (*amqp.Channel, <-chan amqp.Return, error) {
	if c.ch != nil && !c.ch.IsClosed() {
		return c.ch, c.returns, nil
	}
	c.Reset()
	conn, err := Dial(c.url, c.cfg, c.name)
	if err != nil {
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("open a confirm channel: %w", err)
	}
	c.conn, c.ch = conn, ch
	c.returns = ch.NotifyReturn(make(chan amqp.Return, 16))
	return c.ch, c.returns, nil
}

// Reset closes the connection, if any: the next Channel opens another. A
// channel whose confirmations are unknown must not be used again.
func (c *Confirmed) Reset() {
	if c.conn != nil {
		c.conn.Close()
	}
	c.conn, c.ch, c.returns = nil, nil, nil
}

// CollectReturns reads returns until the function it returns is called,
// which returns them by message_id. The broker returns an unroutable
// mandatory message before it confirms it, so once a batch's confirmations
// are in, so are its returns.
func CollectReturns(returns <-chan amqp.Return) func() map[string]amqp.Return {
	got := make(map[string]amqp.Return)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case r, ok := <-returns:
				if !ok {
					return
				}
				got[r.MessageId] = r
			case <-stop:
				return
			}
		}
	}()
	return func() map[string]amqp.Return {
		close(stop)
		<-done
		return got
	}
}
