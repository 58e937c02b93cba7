package kafkadedup

import "time"

// WithTopicCheck sets how often the consumed topics' existence is asked, so
// that a test sees a topic created without waiting the default 30 s.
func WithTopicCheck(d time.Duration) Opt {
	return optFunc(func(c *consumerConfig) { c.topicCheck = d })
}
