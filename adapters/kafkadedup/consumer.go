package kafkadedup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Defaults of a [Consumer]'s options.
const (
	DefaultMaxPollRecords  = 1000
	DefaultPartitionBuffer = 2000
	DefaultDrainTimeout    = 10 * time.Second
)

// commitTimeout bounds each synchronous commit and the final group leave.
const commitTimeout = 10 * time.Second

// ErrRunning is returned by [Consumer.Run] while another Run of the same
// Consumer is in progress.
var ErrRunning = errors.New("kafkadedup: consumer is already running")

// ErrOutage is dedup.ErrOutage: settling records has kept failing (the
// store or the dead-letter sink unreachable) for longer than the wrapper's
// dedup.WithOutageThreshold, as reported by [Consumer.Health], or than
// [WithMaxOutage], as returned by [Consumer.Run].
var ErrOutage = dedup.ErrOutage

// Opt configures a [Consumer].
type Opt interface{ apply(*consumerConfig) }

type optFunc func(*consumerConfig)

func (f optFunc) apply(x *consumerConfig) { f(x) }

type consumerConfig struct {
	clientOpts   []kgo.Opt
	logger       *slog.Logger
	maxPoll      int
	buffer       int
	drainTimeout time.Duration
	errBackoff   dedup.Backoff
	maxOutage    time.Duration
	topicCheck   time.Duration // how often the consumed topics' existence is asked
}

// WithClientOpts adds kgo client options: brokers, TLS, SASL, the consumer
// group and its topics are the caller's. The Consumer appends the options
// its guarantees rest on (AutoCommitMarks, BlockRebalanceOnPoll,
// OnPartitionsRevoked, OnPartitionsLost), which override the caller's.
func WithClientOpts(opts ...kgo.Opt) Opt {
	return optFunc(func(c *consumerConfig) { c.clientOpts = append(c.clientOpts, opts...) })
}

// WithLogger sets the logger for the poll loop and partition workers
// (default: slog.Default() as of NewConsumer). They log at WARN what they
// will retry (a fetch error, a record not settled before an outage, a lost
// partition), and at ERROR a failed commit. The wrapper has its own logger,
// dedup.WithLogger, and logs an outage of the store or the dead-letter sink
// (dedup.WithOutageThreshold).
func WithLogger(l *slog.Logger) Opt { return optFunc(func(c *consumerConfig) { c.logger = l }) }

// WithMaxPollRecords caps the records taken from the client per poll
// (default 1000).
func WithMaxPollRecords(n int) Opt { return optFunc(func(c *consumerConfig) { c.maxPoll = n }) }

// WithPartitionBuffer sets how many fetched records may wait for one
// partition's worker before fetching that partition pauses (default 2000).
func WithPartitionBuffer(n int) Opt { return optFunc(func(c *consumerConfig) { c.buffer = n }) }

// WithDrainTimeout sets how long a running handler may go on after its
// partition is revoked or Run's context is done, before its context is
// canceled (default 10 s). Keep it well under the group's rebalance timeout.
func WithDrainTimeout(d time.Duration) Opt {
	return optFunc(func(c *consumerConfig) { c.drainTimeout = d })
}

// WithErrorBackoff sets the wait before a record is tried again after the
// wrapper returned an error (store or dead-letter topic unreachable);
// default dedup.ExponentialBackoff(100ms, 5s).
func WithErrorBackoff(b dedup.Backoff) Opt {
	return optFunc(func(c *consumerConfig) { c.errBackoff = b })
}

// WithMaxOutage makes Run shut down, as if its context were canceled, and
// return an error matching [ErrOutage] once settling records has kept
// failing for longer than d (default 0: Run never gives up), so that a
// supervisor can restart or replace the process.
func WithMaxOutage(d time.Duration) Opt { return optFunc(func(c *consumerConfig) { c.maxOutage = d }) }

// Consumer runs a consumer-group poll loop that passes every record through
// a dedup wrapper, one goroutine per assigned partition: a partition's
// records run in order, partitions in parallel. Each fetched partition batch
// is claimed in one store round trip (Wrapper.HandleBatch). A record's
// offset is marked for commit only once its outcome is durable, and never
// past a record that is not yet settled: a record to retry (or held by
// another worker) waits in place and runs again, and a record whose outcome
// could not be recorded (store or dead-letter topic unreachable) is retried
// with backoff, holding back its partition. A crash or rebalance therefore
// redelivers at worst records the wrapper recognises as duplicates.
//
// Marked offsets are committed by kgo's autocommit, synchronously when
// partitions are revoked, and at shutdown. A partition whose worker is more
// than the partition buffer behind stops being fetched until it catches up.
type Consumer struct {
	w       *dedup.Wrapper[*kgo.Record]
	cfg     consumerConfig
	running atomic.Bool
	missing missingTopics // consumed topics that do not exist, while Run runs
}

// NewConsumer returns a Consumer that passes records through w. The kgo
// client is created by Run, from the options given with WithClientOpts,
// which must name a consumer group (kgo.ConsumerGroup) and its topics
// (kgo.ConsumeTopics); NewConsumer checks them without contacting a broker,
// and fails with an error matching dedup.ErrConfig that names what is
// missing or invalid.
func NewConsumer(w *dedup.Wrapper[*kgo.Record], opts ...Opt) (*Consumer, error) {
	cfg := consumerConfig{
		logger:       slog.Default(),
		maxPoll:      DefaultMaxPollRecords,
		buffer:       DefaultPartitionBuffer,
		drainTimeout: DefaultDrainTimeout,
		errBackoff:   dedup.ExponentialBackoff(100*time.Millisecond, 5*time.Second),
		topicCheck:   defaultTopicCheck,
	}
	for _, o := range opts {
		o.apply(&cfg)
	}
	switch {
	case w == nil:
		return nil, fmt.Errorf("%w: kafkadedup.NewConsumer: nil wrapper", dedup.ErrConfig)
	case cfg.logger == nil || cfg.errBackoff == nil:
		return nil, fmt.Errorf("%w: kafkadedup: nil logger or error backoff", dedup.ErrConfig)
	case cfg.maxPoll < 1 || cfg.buffer < 1:
		return nil, fmt.Errorf("%w: kafkadedup: max poll records (%d) and partition buffer (%d) must be positive",
			dedup.ErrConfig, cfg.maxPoll, cfg.buffer)
	case cfg.drainTimeout < 0:
		return nil, fmt.Errorf("%w: kafkadedup: negative drain timeout", dedup.ErrConfig)
	case cfg.maxOutage < 0:
		return nil, fmt.Errorf("%w: kafkadedup: WithMaxOutage(%v): must not be negative", dedup.ErrConfig, cfg.maxOutage)
	}
	if err := checkClientOpts(cfg.clientOpts); err != nil {
		return nil, err
	}
	return &Consumer{w: w, cfg: cfg}, nil
}

// errOffline is what the client built by checkClientOpts gets for every
// connection it tries.
var errOffline = errors.New("kafkadedup: offline client for checking options")

// checkClientOpts checks the kgo options given to a Consumer: they must name
// a consumer group and its topics, and be valid with the options Run adds.
// It reads them back from a client built with every connection refused, so
// checking contacts no broker and joins no group.
func checkClientOpts(opts []kgo.Opt) error {
	offline := append(slices.Clip(opts),
		kgo.DialTLSConfig(nil),
		kgo.Dialer(func(context.Context, string, string) (net.Conn, error) { return nil, errOffline }),
		kgo.WithLogger(nil),
	)
	cl, err := kgo.NewClient(offline...)
	if err != nil {
		return fmt.Errorf("%w: kafkadedup: WithClientOpts: %v", dedup.ErrConfig, err)
	}
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	topics, _ := cl.OptValue(kgo.ConsumeTopics).([]string)
	cl.Close()
	switch {
	case group == "":
		return fmt.Errorf("%w: kafkadedup: WithClientOpts names no consumer group: add kgo.ConsumerGroup", dedup.ErrConfig)
	case len(topics) == 0:
		return fmt.Errorf("%w: kafkadedup: WithClientOpts names no topics: add kgo.ConsumeTopics", dedup.ErrConfig)
	}
	if err := kgo.ValidateOpts(append(offline, runOpts(&session{})...)...); err != nil {
		return fmt.Errorf("%w: kafkadedup: WithClientOpts: %v", dedup.ErrConfig, err)
	}
	return nil
}

// runOpts are the client options Run adds to the caller's: those the
// Consumer's guarantees rest on.
func runOpts(s *session) []kgo.Opt {
	return []kgo.Opt{
		kgo.AutoCommitMarks(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	}
}

// Run creates the client, joins the group and consumes until ctx is done.
// It then shuts down: it stops fetching, lets running handlers finish within
// the drain timeout (then cancels them; a record not settled is not marked),
// commits the marked offsets, leaves the group and closes the client. The
// commit and the leave are bounded by 10 s together, the settling of a
// canceled attempt by the wrapper's own bound. It returns nil after a clean
// shutdown, or the error that prevented starting or the final commit. With
// [WithMaxOutage], Run also shuts down, and returns an error matching
// [ErrOutage], once settling records has kept failing for longer than that
// bound.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)

	g := adapterkit.NewGuard(ctx, c.w, c.cfg.maxOutage)
	s := &session{cfg: &c.cfg, w: c.w, log: c.cfg.logger, parts: make(map[topicPartition]*partition), guard: g}
	cl, err := kgo.NewClient(append(slices.Clip(c.cfg.clientOpts), runOpts(s)...)...)
	if err != nil {
		return g.End(fmt.Errorf("kafkadedup: new client: %w", err))
	}
	// Workers, started by the poll loop below, read these; the rebalance
	// callbacks, which may run earlier, do not.
	s.cl = cl
	s.group, _ = cl.OptValue(kgo.ConsumerGroup).(string)
	s.base = context.WithoutCancel(g.Ctx)

	var watch sync.WaitGroup
	wctx, stopWatch := context.WithCancel(g.Ctx)
	watch.Go(func() { s.watchTopics(wctx, &c.missing) })
	s.poll(g.Ctx)
	stopWatch()
	watch.Wait()
	return g.End(s.shutdown())
}

// session is the state of one Run.
type session struct {
	cfg   *consumerConfig
	w     *dedup.Wrapper[*kgo.Record]
	log   *slog.Logger
	cl    *kgo.Client
	group string
	base  context.Context // parent of the handlers' contexts

	// guard stops Run once failures have lasted longer than WithMaxOutage;
	// each partition's Policy checks its outage.
	guard *adapterkit.Guard

	mu    sync.Mutex
	parts map[topicPartition]*partition
}

type topicPartition struct {
	topic     string
	partition int32
}

// poll hands each fetched partition batch to its worker until ctx is done.
// Handing over never blocks, so rebalances wait at most one poll.
func (s *session) poll(ctx context.Context) {
	for {
		fetches := s.cl.PollRecords(ctx, s.cfg.maxPoll)
		if fetches.IsClientClosed() || ctx.Err() != nil {
			return
		}
		fetches.EachError(func(topic string, p int32, err error) {
			s.log.Warn("kafkadedup: fetch error", slog.String("topic", topic), slog.Int("partition", int(p)), slog.Any("error", err))
		})
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				s.worker(p.Topic, p.Partition).push(p.Records)
			}
		})
		s.cl.AllowRebalance()
	}
}

// worker returns the partition's worker, starting it on first use.
func (s *session) worker(topic string, p int32) *partition {
	tp := topicPartition{topic, p}
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.parts[tp]
	if w == nil {
		w = newPartition(s, tp)
		s.parts[tp] = w
		go w.run()
	}
	return w
}

// revoked stops the revoked partitions' workers and commits what they
// marked, before the group hands the partitions to another member.
func (s *session) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	s.stop(revoked)
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		s.log.Error("kafkadedup: commit on revoke failed; the new owner will see records again as duplicates", slog.Any("error", err))
	}
}

// lost stops the lost partitions' workers; their offsets cannot be committed
// any more.
func (s *session) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.stop(lost)
	if len(lost) > 0 {
		s.log.Warn("kafkadedup: partitions lost; their uncommitted records will be redelivered", slog.Any("partitions", lost))
	}
}

// stop stops the workers of the given partitions (all when tps is nil) and
// waits for them; their drain timeouts run concurrently.
func (s *session) stop(tps map[string][]int32) {
	s.mu.Lock()
	var ws []*partition
	for tp, w := range s.parts {
		if tps == nil || slices.Contains(tps[tp.topic], tp.partition) {
			ws = append(ws, w)
			delete(s.parts, tp)
		}
	}
	s.mu.Unlock()
	for _, w := range ws {
		w.stop()
	}
	for _, w := range ws {
		w.wait()
	}
}

func (s *session) shutdown() error {
	s.stop(nil)
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	err := s.cl.CommitMarkedOffsets(ctx)
	if err != nil {
		err = fmt.Errorf("kafkadedup: final commit: %w", err)
	}
	s.cl.AllowRebalance()
	if lerr := s.cl.LeaveGroupContext(ctx); lerr != nil {
		s.log.Warn("kafkadedup: leaving the group failed; partitions move after the session timeout", slog.Any("error", lerr))
	}
	s.cl.Close()
	return err
}
