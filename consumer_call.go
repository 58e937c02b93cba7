package dedup

import "time"

// CallOpt configures one HandleBatch or HandleConcurrent call: what a
// transport adapter knows of the deliveries it hands over.
type CallOpt interface{ applyCall(*callConfig) }

type callConfig struct {
	lease time.Duration   // the transport's suggestion; 0: none
	stop  <-chan struct{} // HandleBatch's stop signal; nil: none
	group string          // for the dead letters' Origin.Group
}

type callOptFunc func(*callConfig)

func (f callOptFunc) applyCall(c *callConfig) { f(c) }

// CallLease sets the lease of the call's deliveries where the wrapper has no
// [WithLease]: the redelivery deadline the transport knows, such as the SQS
// visibility timeout.
func CallLease(d time.Duration) CallOpt { return callOptFunc(func(c *callConfig) { c.lease = d }) }

// CallStop gives HandleBatch a transport's stop signal: once stop is closed,
// the batch runs no further handler; it gives yield the results it has and
// gives back the claims of the rest, as when yield returns false. Unlike
// cancelling the context, it leaves the handler running at the time alone,
// so that a shutdown is not held back by completions waiting to be written
// together.
func CallStop(stop <-chan struct{}) CallOpt {
	return callOptFunc(func(c *callConfig) { c.stop = stop })
}

// CallGroup names the consumer group (or subscription) the call's
// deliveries are consumed by, for their dead letters' Origin.Group where
// the message itself does not say.
func CallGroup(group string) CallOpt { return callOptFunc(func(c *callConfig) { c.group = group }) }

// suggestedLease is CallLease's, or 0 for none (c nil: a Handle call).
func (c *callConfig) suggestedLease() time.Duration {
	if c == nil {
		return 0
	}
	return c.lease
}

func callOptions(opts []CallOpt) callConfig {
	var c callConfig
	for _, o := range opts {
		o.applyCall(&c)
	}
	return c
}
