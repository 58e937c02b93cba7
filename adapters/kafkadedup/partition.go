package kafkadedup

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/adapterkit"
	"github.com/dedupkit/dedup/internal/logattr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// markInterval bounds how long a settled record waits to be marked while the
// rest of its batch runs.
const markInterval = 100 * time.Millisecond

// partition is the worker of one assigned partition: it runs the partition's
// records through the wrapper strictly in order and marks each one once it is
// settled.
type partition struct {
	s   *session
	tp  topicPartition
	log *slog.Logger
	// policy decides the records' actions, with the partition's own count
	// of failures in a row: a record waits in place for its delay.
	policy *adapterkit.Policy

	mu     sync.Mutex
	queue  [][]*kgo.Record // fetched batches not yet taken
	queued int             // records in queue
	paused bool            // fetching this partition is paused

	wake chan struct{} // a batch was queued
	quit chan struct{} // closed to stop the worker
	done chan struct{} // closed when the worker has returned

	// ctx is the handlers' context; it is canceled when the drain timeout
	// runs out after quit.
	ctx    context.Context
	cancel context.CancelFunc
	drain  *time.Timer
}

func newPartition(s *session, tp topicPartition) *partition {
	ctx, cancel := context.WithCancel(s.base)
	return &partition{
		s:      s,
		tp:     tp,
		log:    s.log.With(slog.String("group", s.group), slog.String("topic", tp.topic), slog.Int("partition", int(tp.partition))),
		policy: s.guard.NewPolicy(adapterkit.Unbounded, s.cfg.errBackoff),
		wake:   make(chan struct{}, 1),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
}

// push queues a fetched batch, pausing the partition's fetching when the
// worker is that far behind. It is called by the poll loop only.
func (p *partition) push(recs []*kgo.Record) {
	p.mu.Lock()
	p.queue = append(p.queue, recs)
	p.queued += len(recs)
	if !p.paused && p.queued >= p.s.cfg.buffer {
		p.paused = true
		p.s.cl.PauseFetchPartitions(p.tpMap())
	}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// pop takes the next batch, waiting for one; false means the worker must stop.
func (p *partition) pop() ([]*kgo.Record, bool) {
	for {
		p.mu.Lock()
		if len(p.queue) > 0 {
			recs := p.queue[0]
			p.queue[0] = nil
			p.queue = p.queue[1:]
			p.queued -= len(recs)
			if p.paused && p.queued <= p.s.cfg.buffer/2 {
				p.resumeLocked()
			}
			p.mu.Unlock()
			return recs, true
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-p.quit:
			return nil, false
		}
	}
}

func (p *partition) resumeLocked() {
	p.paused = false
	p.s.cl.ResumeFetchPartitions(p.tpMap())
}

func (p *partition) tpMap() map[string][]int32 {
	return map[string][]int32{p.tp.topic: {p.tp.partition}}
}

func (p *partition) stopping() bool {
	select {
	case <-p.quit:
		return true
	default:
		return false
	}
}

// run is the worker's goroutine. A record that is not settled (OutcomeRetry,
// OutcomeInFlight, or an error making its outcome durable) is tried again in place
// after a wait, so nothing after it runs or is marked before it settles.
func (p *partition) run() {
	defer close(p.done)
	var pending []*kgo.Record
	for {
		if len(pending) == 0 {
			recs, ok := p.pop()
			if !ok {
				return
			}
			pending = recs
		}
		var d adapterkit.Decision
		pending, d = p.process(pending)
		if d.Err != nil {
			d.LogFailure(p.ctx, p.log, "kafkadedup: record not settled; it is tried again (in place, or by the partition's next owner)", slog.Int64("offset", pending[0].Offset),
				slog.Int("consecutive_errors", d.Failures))
		}
		if p.stopping() {
			return
		}
		if len(pending) > 0 && !p.sleep(d.Delay) {
			return
		}
	}
}

// process runs recs through the wrapper with one batch claim, then marks the
// settled ones. It returns the records still to do, starting with the
// first unsettled one, and the decision for that one: how long to wait
// before trying it again.
func (p *partition) process(recs []*kgo.Record) (rest []*kgo.Record, d adapterkit.Decision) {
	next := 0 // the first record not settled
	held := false
	marked, markedAt := 0, time.Now()
	adapterkit.InOrder(p.policy.Batch(p.quit), recs, func(rs []*kgo.Record, yield func(int, dedup.Result, error) bool) error {
		return p.s.w.HandleBatch(p.ctx, rs, yield, dedup.CallStop(p.quit), dedup.CallGroup(p.s.group))
	}, func(i int, res dedup.Result, rd adapterkit.Decision) {
		if held {
			return // behind the first not settled: not run, it waits in place too
		}
		if !rd.Settled() {
			held, d = true, rd
			if rd.Err == nil && !p.stopping() {
				p.log.Debug("kafkadedup: record not settled yet; waiting in place", slog.Int64("offset", recs[i].Offset),
					slog.String("outcome", res.Outcome.String()), logattr.Duration("retry_after", rd.Delay))
			}
			return
		}
		next = i + 1
		// Marking a record marks those before it too: one mark per
		// markInterval, and one at the end, instead of one per record
		// (each mark allocates).
		if now := time.Now(); now.Sub(markedAt) >= markInterval {
			p.s.cl.MarkCommitRecords(recs[i])
			marked, markedAt = next, now
		}
	})
	if next > marked {
		p.s.cl.MarkCommitRecords(recs[next-1])
	}
	return recs[next:], d
}

// sleep waits for d; false means the worker must stop.
func (p *partition) sleep(d time.Duration) bool {
	if d <= 0 {
		return !p.stopping()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.quit:
		return false
	}
}

// stop tells the worker to finish the record in hand and return; the
// record's handler is canceled if the drain timeout runs out first.
func (p *partition) stop() {
	close(p.quit)
	p.drain = time.AfterFunc(p.s.cfg.drainTimeout, p.cancel)
}

// wait waits for the stopped worker and resumes its partition's fetching,
// so that a later assignment of the partition is fetched again.
func (p *partition) wait() {
	<-p.done
	p.drain.Stop()
	p.cancel()
	p.mu.Lock()
	if p.paused {
		p.resumeLocked()
	}
	p.mu.Unlock()
}
