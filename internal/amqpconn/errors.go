package amqpconn

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNacked means the broker refused a message (a negative publisher
// confirm, which RabbitMQ sends on an internal error of a queue). It is
// amqpdedup.ErrNacked.
var ErrNacked = errors.New("amqpdedup: the broker refused the message")

// UnroutableError means the broker routed a message to no queue: the
// exchange has no binding for its routing key, or, on the default exchange,
// no queue has that name. The message was published as mandatory, so the
// broker returned it instead of dropping it. It is amqpdedup.UnroutableError.
type UnroutableError struct {
	Exchange   string
	RoutingKey string
	ReplyText  string
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("amqp: unroutable: exchange %q, routing key %q: %s", e.Exchange, e.RoutingKey, e.ReplyText)
}

// Unroutable returns the error of a message the broker returned as ret.
func Unroutable(ret amqp.Return) *UnroutableError {
	return &UnroutableError{Exchange: ret.Exchange, RoutingKey: ret.RoutingKey, ReplyText: ret.ReplyText}
}
