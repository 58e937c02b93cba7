package outbox_test

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// refuseProduce makes the cluster answer every produce request with a
// retriable error while the returned flag is set, as a broker short of
// in-sync replicas does.
func refuseProduce(kc *kfake.Cluster) *atomic.Bool {
	var on atomic.Bool
	kc.ControlKey(int16(kmsg.Produce), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		return refusal(kreq.(*kmsg.ProduceRequest), kerr.NotEnoughReplicas), nil, true
	})
	return &on
}

// kgoCreateTopic creates a one-partition topic.
func kgoCreateTopic(cl *kgo.Client, topic string) (*kmsg.CreateTopicsResponse, error) {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, 1
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	return resp, err
}
