package reliability_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/crashtest"
)

// soak reports whether the long versions of the campaigns were asked for.
func soak() bool { return crashtest.Soak() }

// runID returns a short identifier unique to this run, for table names,
// topics and scopes.
func runID() string { return crashtest.RunID() }

// kafka is an in-process Kafka cluster listening on loopback TCP, so that
// worker processes reach it too, with one topic and its dead-letter topic.
type kafka struct {
	*kfake.Cluster
	t          *testing.T
	topic      string
	dlq        string
	partitions int32
	addrs      []string
	admin      *kgo.Client
}

func newKafka(t *testing.T, partitions int32) *kafka {
	t.Helper()
	topic := "events-" + runID()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic, topic+".dlq"),
		kfake.GroupMinSessionTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ProducerLinger(0))
	if err != nil {
		kc.Close()
		t.Fatal(err)
	}
	k := &kafka{Cluster: kc, t: t, topic: topic, dlq: topic + ".dlq", partitions: partitions, addrs: kc.ListenAddrs(), admin: admin}
	t.Cleanup(func() {
		admin.Close()
		kc.Close()
	})
	return k
}

// clientOpts are the kgo options of a consumer of the topic: quick
// heartbeats, session timeouts, fetches and autocommits, so that a dead
// member's partitions move within seconds.
func (k *kafka) clientOpts(group string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(k.addrs...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(k.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.AutoCommitInterval(200 * time.Millisecond),
		kgo.SessionTimeout(2500 * time.Millisecond),
		kgo.HeartbeatInterval(250 * time.Millisecond),
		kgo.RebalanceTimeout(15 * time.Second),
	}
}

// producer returns a client producing to the cluster, closed when t ends.
func (k *kafka) producer(opts ...kgo.Opt) *kgo.Client {
	k.t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.addrs...), kgo.ProducerLinger(0)}, opts...)...)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(cl.Close)
	return cl
}

// produce writes recs in order; they get their partitions and offsets.
func (k *kafka) produce(recs ...*kgo.Record) {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), crashtest.Stall)
	defer cancel()
	if err := k.admin.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		k.t.Fatalf("produce: %v", err)
	}
}

// produceOver writes recs in chunks spread evenly over d, in the
// background; the returned channel gets the first error, then closes.
func (k *kafka) produceOver(recs []*kgo.Record, d time.Duration) <-chan error {
	const chunk = 250
	done := make(chan error, 1)
	go func() {
		defer close(done)
		chunks := (len(recs) + chunk - 1) / chunk
		start := time.Now()
		for i := 0; i < chunks; i++ {
			if wait := time.Until(start.Add(d * time.Duration(i) / time.Duration(chunks))); wait > 0 {
				time.Sleep(wait)
			}
			ctx, cancel := context.WithTimeout(context.Background(), crashtest.Stall)
			err := k.admin.ProduceSync(ctx, recs[i*chunk:min(len(recs), (i+1)*chunk)]...).FirstErr()
			cancel()
			if err != nil {
				done <- fmt.Errorf("produce chunk %d: %w", i, err)
				return
			}
		}
	}()
	return done
}

// committed returns the group's committed offsets on the topic.
func (k *kafka) committed(group string) (map[int32]int64, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, k.admin)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		if t.Topic != k.topic {
			continue
		}
		for _, p := range t.Partitions {
			if p.Offset >= 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out, nil
}

// endOffsets returns, per partition of topic, the offset after its last
// record.
func (k *kafka) endOffsets(topic string) map[int32]int64 {
	k.t.Helper()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	for p := range k.partitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = p, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, k.admin)
	if err != nil {
		k.t.Fatalf("list offsets of %s: %v", topic, err)
	}
	out := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				k.t.Fatalf("list offsets of %s/%d: error code %d", topic, p.Partition, p.ErrorCode)
			}
			if p.Offset > 0 {
				out[p.Partition] = p.Offset
			}
		}
	}
	return out
}

// caughtUp reports whether the group committed every partition of the topic
// to its end.
func (k *kafka) caughtUp(group string) bool {
	got, err := k.committed(group)
	if err != nil {
		return false
	}
	for p, end := range k.endOffsets(k.topic) {
		if got[p] != end {
			return false
		}
	}
	return true
}

// readAll returns every record of topic, up to its end offsets, failing t
// once a fetch brought nothing for crashtest.Stall.
func (k *kafka) readAll(topic string) []*kgo.Record {
	k.t.Helper()
	end := k.endOffsets(topic)
	if len(end) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		k.t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	next := map[int32]int64{}
	for {
		done := true
		for p, e := range end {
			done = done && next[p] >= e
		}
		if done {
			return out
		}
		ctx, cancel := context.WithTimeout(context.Background(), crashtest.Stall)
		fs := cl.PollFetches(ctx)
		expired := ctx.Err() != nil
		cancel()
		if expired {
			k.t.Fatalf("read %d records of %s, then nothing for %v; want offsets up to %v", len(out), topic, crashtest.Stall, end)
		}
		fs.EachRecord(func(r *kgo.Record) {
			out = append(out, r)
			next[r.Partition] = r.Offset + 1
		})
	}
}

// planned is one distinct event of a campaign.
type planned struct {
	id      string
	key     string
	poison  bool // its handler always fails
	crasher bool // its handler kills the worker process
}

// plan is what a campaign produces: distinct events, some sent twice, some
// poison (their handler always fails).
type plan struct {
	events   []planned
	records  []*kgo.Record // in produce order
	dups     int
	poison   int
	crashers int
}

// newPlan makes n events, sends dupRate of them a second time (a third of
// those copies with another key, so on another partition), some way after
// the first, marks poisonRate of them as poison and makes crashers of them
// crash their worker.
func newPlan(topic, prefix string, n int, dupRate, poisonRate float64, crashers int, rng *rand.Rand) *plan {
	p := &plan{events: make([]planned, n), crashers: crashers}
	crash := map[int]bool{}
	for len(crash) < crashers {
		crash[n/10+rng.IntN(n*8/10)] = true // not at the very start or end
	}
	type slot struct {
		at  float64
		rec *kgo.Record
	}
	slots := make([]slot, 0, n+int(float64(n)*dupRate)+1)
	for i := range p.events {
		e := planned{id: fmt.Sprintf("%s-%d", prefix, i), key: "k-" + strconv.Itoa(rng.IntN(97)), crasher: crash[i]}
		e.poison = !e.crasher && rng.Float64() < poisonRate
		p.events[i] = e
		if e.poison {
			p.poison++
		}
		slots = append(slots, slot{float64(i), e.record(topic, e.key)})
		if rng.Float64() < dupRate {
			key := e.key
			if rng.IntN(3) == 0 {
				key = "k-" + strconv.Itoa(rng.IntN(97))
			}
			slots = append(slots, slot{float64(i) + 0.5 + float64(rng.IntN(2000)), e.record(topic, key)})
			p.dups++
		}
	}
	sort.SliceStable(slots, func(i, j int) bool { return slots[i].at < slots[j].at })
	for _, s := range slots {
		p.records = append(p.records, s.rec)
	}
	return p
}

func (e planned) record(topic, key string) *kgo.Record {
	return &kgo.Record{
		Topic:   topic,
		Key:     []byte(key),
		Value:   fmt.Appendf(nil, `{"id":%q,"poison":%t,"crash":%t}`, e.id, e.poison, e.crasher),
		Headers: []kgo.RecordHeader{{Key: "event-id", Value: []byte(e.id)}},
	}
}

// isPoison reports whether a record is one of a plan's poison events.
func isPoison(r *kgo.Record) bool { return bytes.Contains(r.Value, []byte(`"poison":true`)) }

// isCrasher reports whether a record is one of a plan's crashers.
func isCrasher(r *kgo.Record) bool { return bytes.Contains(r.Value, []byte(`"crash":true`)) }

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// effectsTable creates a business table without any unique constraint, so
// that an effect applied twice is two rows, and drops it when t ends.
func effectsTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := "rel_effects_" + runID()
	if _, err := pool.Exec(context.Background(), `CREATE TABLE `+table+` (
		event_id text NOT NULL, worker text NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	return table
}

// effectRows returns, per event, the workers that applied its effect (one
// entry per row).
func effectRows(t *testing.T, pool *pgxpool.Pool, table string) map[string][]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT event_id, worker FROM `+table+` ORDER BY applied_at`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	var id, worker string
	_, err = pgx.ForEachRow(rows, []any{&id, &worker}, func() error {
		out[id] = append(out[id], worker)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// recordsTable returns a dedup table name unique to this run, dropped when t
// ends.
func recordsTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := "rel_records_" + runID()
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+table) })
	return table
}

// figures are what a campaign counts at its end.
type figures struct {
	events, records, dups, poison int
	crashers                      int // events that kill their worker
	kills, restarts, outages      int
	rebalances                    int // restarts late enough for the group to move the partitions
	crashes                       int // workers killed by a crasher
	effects                       int // effect rows
	deadLetters                   int // records in the dead-letter topic
	deadLettered                  int // distinct events among them
	extraLetters                  int // dead letters beyond one per event
	lost                          int // good events without effect, poison events not dead-lettered
	appliedTwice                  int // events with more than one effect
	goodDeadLettered              int // good events dead-lettered for another reason than a crash loop
	collateral                    int // good events parked as a crash loop: in flight in a worker that died again and again
	collateralApplied             int // ... of which an attempt applied the effect, its worker killed before recording it
	poisonApplied                 int // poison events with an effect
	reasons                       map[string]int
	elapsed                       time.Duration
	goodLetters                   []string // each good event in the dead-letter topic: its letters and effects
}

func (f figures) String() string {
	var reasons []string
	for r, n := range f.reasons {
		reasons = append(reasons, fmt.Sprintf("%s=%d", r, n))
	}
	slices.Sort(reasons)
	return fmt.Sprintf("events=%d records=%d duplicates_injected=%d poison=%d crashers=%d kills=%d crashes=%d restarts=%d late_restarts=%d outages=%d "+
		"effects=%d dead_letters=%d dead_lettered_events=%d extra_dead_letters=%d lost=%d applied_twice=%d "+
		"good_dead_lettered=%d crash_loop_collateral=%d (applied_before_parked=%d) poison_applied=%d reasons=[%s] elapsed=%v",
		f.events, f.records, f.dups, f.poison, f.crashers, f.kills, f.crashes, f.restarts, f.rebalances, f.outages,
		f.effects, f.deadLetters, f.deadLettered, f.extraLetters, f.lost, f.appliedTwice,
		f.goodDeadLettered, f.collateral, f.collateralApplied, f.poisonApplied, strings.Join(reasons, " "), f.elapsed.Round(time.Millisecond))
}

// count checks a campaign's end state: the effects (workers per event) and
// the dead-letter topic's records against the plan. It fills in the
// figures and returns the event IDs applied more than once.
func count(p *plan, effects map[string][]string, dlq []*kgo.Record) (figures, []string) {
	return countDeaths(p, effects, dlq, nil)
}

// countDeaths is count for a campaign whose workers die: died reports
// whether the named worker process died (killed, or by a crasher) rather
// than stopping. A good event parked as a crash loop is collateral when
// every effect it has was applied by a worker that died: in claim mode the
// effect commits before the record is completed, so the attempt that a
// death cut may have applied it (the claim-mode crash window) before the
// next claim found the attempts used up. An effect of a worker that lived
// makes the letter a good event dead-lettered.
func countDeaths(p *plan, effects map[string][]string, dlq []*kgo.Record, died func(worker string) bool) (figures, []string) {
	f := figures{events: len(p.events), records: len(p.records), dups: p.dups, poison: p.poison,
		crashers: p.crashers, deadLetters: len(dlq), reasons: map[string]int{}}
	letters := map[string]int{}
	crashLoops := map[string]int{} // letters with reason crash-loop
	for _, r := range dlq {
		id := header(r, "dedup-event-id")
		letters[id]++
		f.reasons[header(r, "dedup-reason")]++
		if header(r, "dedup-reason") == string(dedup.ReasonCrashLoop) {
			crashLoops[id]++
		}
	}
	var twice []string
	for _, e := range p.events {
		n := len(effects[e.id])
		f.effects += n
		if n > 1 {
			f.appliedTwice++
			twice = append(twice, fmt.Sprintf("%s%v", e.id, effects[e.id]))
		}
		if l := letters[e.id]; l > 0 {
			f.deadLettered++
			f.extraLetters += l - 1
		}
		bad := e.poison || e.crasher
		switch {
		case bad && n > 0:
			f.poisonApplied++
		case bad && letters[e.id] == 0, e.crasher && crashLoops[e.id] == 0:
			f.lost++ // a crasher must be parked as a crash loop
		case !bad && letters[e.id] > 0 && crashLoops[e.id] == letters[e.id] && (n == 0 || allDied(effects[e.id], died)):
			f.collateral++
			if n > 0 {
				f.collateralApplied++
			}
			f.goodLetters = append(f.goodLetters, "collateral "+describeLetters(e.id, dlq, effects[e.id]))
		case !bad && letters[e.id] > 0:
			f.goodDeadLettered++
			f.goodLetters = append(f.goodLetters, "good "+describeLetters(e.id, dlq, effects[e.id]))
		case !bad && n == 0:
			f.lost++
		}
	}
	return f, twice
}

// allDied reports whether every worker in workers died, as died says; false
// when died is nil.
func allDied(workers []string, died func(string) bool) bool {
	if died == nil {
		return false
	}
	for _, w := range workers {
		if !died(w) {
			return false
		}
	}
	return true
}

// describeLetters says what the dead-letter topic holds for event id and
// who applied its effect: enough to tell a crash loop from a verdict.
func describeLetters(id string, dlq []*kgo.Record, applied []string) string {
	var ls []string
	for _, r := range dlq {
		if header(r, "dedup-event-id") != id {
			continue
		}
		ls = append(ls, fmt.Sprintf("{reason=%s attempts=%s origin=%s/%s@%s error=%q cause=%q}",
			header(r, "dedup-reason"), header(r, "dedup-attempts"), header(r, "dedup-origin-topic"),
			header(r, "dedup-origin-partition"), header(r, "dedup-origin-offset"),
			header(r, "dedup-error"), header(r, "dedup-cause")))
	}
	return fmt.Sprintf("%s letters %s effects %v", id, strings.Join(ls, " "), applied)
}

// settled tracks, in process, the events whose outcome the wrapper reported
// durable (through WithObserver), and checks that a group's committed
// offsets never pass a record whose event is not among them.
type settled struct {
	mu  sync.Mutex
	ids map[string]bool
}

func newSettled() *settled { return &settled{ids: map[string]bool{}} }

// observe is a dedup.WithObserver function.
func (s *settled) observe(_ context.Context, res dedup.Result) {
	if res.Settled() {
		s.mu.Lock()
		s.ids[res.Key.EventID] = true
		s.mu.Unlock()
	}
}

func (s *settled) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id]
}

// watchCommits polls the group's committed offsets until ctx is done and
// returns the records it saw committed before their event was settled.
// recs must have been produced (they carry their partitions and offsets).
func (s *settled) watchCommits(ctx context.Context, k *kafka, group string, recs []*kgo.Record) <-chan []string {
	byPartition := map[int32][]*kgo.Record{}
	for _, r := range recs {
		byPartition[r.Partition] = append(byPartition[r.Partition], r)
	}
	for _, rs := range byPartition {
		slices.SortFunc(rs, func(a, b *kgo.Record) int { return int(a.Offset - b.Offset) })
	}
	out := make(chan []string, 1)
	go func() {
		var violations []string
		checked := map[int32]int{} // per partition, records already checked
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			if got, err := k.committed(group); err == nil {
				for p, off := range got {
					rs := byPartition[p]
					for checked[p] < len(rs) && rs[checked[p]].Offset < off {
						r := rs[checked[p]]
						if !s.has(header(r, "event-id")) {
							violations = append(violations, fmt.Sprintf("%d@%d (%s) committed (offset %d) before it was settled",
								p, r.Offset, header(r, "event-id"), off))
						}
						checked[p]++
					}
				}
			}
			select {
			case <-ctx.Done():
				out <- violations
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

// moved measures how far a group got, for crashtest.Await: the events
// settled (when st is not nil) plus the offsets committed; 0 while the
// committed offsets cannot be read, which is no progress.
func (k *kafka) moved(group string, st *settled) func() int {
	return func() int {
		committed, err := k.committed(group)
		if err != nil {
			return 0
		}
		n := 0
		if st != nil {
			n = st.count()
		}
		for _, off := range committed {
			n += int(off)
		}
		return n
	}
}

// await waits for cond while the group moves (crashtest.Await), failing t
// once it stood still for crashtest.Stall, saying what it waited for and how
// far the group got.
func (k *kafka) await(t *testing.T, group string, st *settled, what string, cond func() bool) {
	t.Helper()
	crashtest.Await(t, what, cond, k.moved(group, st), k.progress(group, st))
}

// progress describes how far a group got: events settled (when st is not
// nil), committed and end offsets.
func (k *kafka) progress(group string, st *settled) func() string {
	return func() string {
		committed, err := k.committed(group)
		s := fmt.Sprintf("committed %v (%v), end %v", committed, err, k.endOffsets(k.topic))
		if st != nil {
			s = fmt.Sprintf("%d events settled, %s", st.count(), s)
		}
		return s
	}
}
