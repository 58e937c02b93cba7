// Package consumeropt holds what the Consumers of the transport adapters
// (sqsdedup, natsdedup, amqpdedup) have in common in their configuration:
// the settings they all take, their defaults and validation, and the
// building of a configuration from a Consumer's options.
package consumeropt

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupkit/dedup/deduptype"
)

// DefaultShutdownTimeout is how long a Consumer's Run waits, once its
// context is done, for running handlers before it cancels their contexts.
const DefaultShutdownTimeout = 30 * time.Second

// Common holds the settings every adapter's Consumer takes, each set by the
// adapter's option of the same name (WithInFlightDelay, WithShutdownTimeout,
// WithMaxOutage, WithLogger), whose documentation says what it means for
// that transport.
type Common struct {
	InFlightDelay   time.Duration
	ShutdownTimeout time.Duration
	MaxOutage       time.Duration
	Logger          *slog.Logger
}

// Defaults returns the settings of a Consumer given none: the adapter's own
// in-flight delay, [DefaultShutdownTimeout], no bound on an outage and
// slog.Default().
func Defaults(inFlightDelay time.Duration) Common {
	return Common{InFlightDelay: inFlightDelay, ShutdownTimeout: DefaultShutdownTimeout, Logger: slog.Default()}
}

// Validate returns an error matching deduptype.ErrConfig that names the option
// which set an invalid value, with prefix (such as "natsdedup: ") before
// its name, or nil if all are valid.
func (c *Common) Validate(prefix string) error {
	switch {
	case c.InFlightDelay < 0:
		return fmt.Errorf("%w: %sWithInFlightDelay(%v): must not be negative", deduptype.ErrConfig, prefix, c.InFlightDelay)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("%w: %sWithShutdownTimeout(%v): must be positive", deduptype.ErrConfig, prefix, c.ShutdownTimeout)
	case c.MaxOutage < 0:
		return fmt.Errorf("%w: %sWithMaxOutage(%v): must not be negative", deduptype.ErrConfig, prefix, c.MaxOutage)
	case c.Logger == nil:
		return fmt.Errorf("%w: %sWithLogger(nil)", deduptype.ErrConfig, prefix)
	}
	return nil
}

// Build returns def with opts applied to it in order, or the error validate
// finds in the result.
func Build[C, O any](def C, opts []O, apply func(O, *C), validate func(*C) error) (C, error) {
	for _, o := range opts {
		apply(o, &def)
	}
	if err := validate(&def); err != nil {
		var zero C
		return zero, err
	}
	return def, nil
}
