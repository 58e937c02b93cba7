package kafkadedup

import "github.com/twmb/franz-go/pkg/kgo"

// recordCarrier reads and writes a W3C trace context in a record's headers.
type recordCarrier struct{ r *kgo.Record }

func (c recordCarrier) Get(key string) string {
	if c.r == nil {
		return ""
	}
	for _, h := range c.r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c recordCarrier) Set(key, value string) {
	for i, h := range c.r.Headers {
		if h.Key == key {
			c.r.Headers[i].Value = []byte(value)
			return
		}
	}
	c.r.Headers = append(c.r.Headers, kgo.RecordHeader{Key: key, Value: []byte(value)})
}

func (c recordCarrier) Keys() []string {
	if c.r == nil {
		return nil
	}
	keys := make([]string, len(c.r.Headers))
	for i, h := range c.r.Headers {
		keys[i] = h.Key
	}
	return keys
}
