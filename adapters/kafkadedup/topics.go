package kafkadedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// defaultTopicCheck is how often a Consumer asks the cluster whether the
// topics it consumes exist: a group consuming a topic that does not exist
// is assigned nothing and fetches nothing, and the client says nothing of it.
const defaultTopicCheck = 30 * time.Second

// missingTopics is what a Consumer knows of the topics it consumes that do
// not exist: the error its Health reports, or nil.
type missingTopics struct {
	mu  sync.Mutex
	err error
}

func (m *missingTopics) get() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *missingTopics) set(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = err
}

// watchTopics asks the cluster at once, then every topic check, whether the
// topics the client consumes exist. While some do not, it says so in a
// warning naming them (once per change) and m holds the error for Health;
// once they exist, m is cleared. A client consuming by regular expression
// has no topic to miss.
func (s *session) watchTopics(ctx context.Context, m *missingTopics) {
	defer m.set(nil)
	topics, _ := s.cl.OptValue(kgo.ConsumeTopics).([]string)
	if regex, _ := s.cl.OptValue(kgo.ConsumeRegex).(bool); regex || len(topics) == 0 {
		return
	}
	var said []string
	for {
		missing, err := absentTopics(ctx, s.cl, topics)
		switch {
		case err != nil:
			// The brokers did not answer: the client's own errors say so.
		case len(missing) == 0:
			if said != nil {
				s.log.Info("kafkadedup: the consumed topics exist now", slog.Any("topics", said))
			}
			said = nil
			m.set(nil)
		default:
			merr := fmt.Errorf("kafkadedup: consumed topics do not exist: %s: %w", strings.Join(missing, ", "), kerr.UnknownTopicOrPartition)
			if !slices.Equal(missing, said) {
				s.log.Warn(merr.Error()+"; nothing is consumed from them until they are created", slog.Any("topics", missing))
				said = missing
			}
			m.set(merr)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.topicCheck):
		}
	}
}

// absentTopics returns those of topics the cluster does not know, sorted.
func absentTopics(ctx context.Context, cl *kgo.Client, topics []string) ([]string, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, t := range resp.Topics {
		if t.Topic != nil && errors.Is(kerr.ErrorForCode(t.ErrorCode), kerr.UnknownTopicOrPartition) {
			missing = append(missing, *t.Topic)
		}
	}
	slices.Sort(missing)
	return missing, nil
}
