package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/dedupkit/dedup/adapters/kafkadedup"
)

// plan is what the parent process runs.
type plan struct {
	cfg              config
	n, smallN, flatN int
	dup              float64
	only             []string
	// repeat is how often the quick rows (no dedup, batched on PostgreSQL and
	// on Redis, floor) run; the median run is reported.
	repeat int
	// records are the sizes of the PostgreSQL tables before the runs
	// (-records), ascending; purge, when above 0, the expired records of the
	// purge rows (-purge).
	records []int
	purge   int
}

// repeated are the rows that take seconds, run repeat times in rounds so that
// the load of the moment falls on all of them alike.
var repeated = []string{"none", "batched", "redis-batched", "floor"}

// The environment of a row's subprocess: the row and its configuration.
const (
	childEnv  = "DEDUPBENCH_ROW"
	configEnv = "DEDUPBENCH_CONFIG"
)

// job is one row at one N, on a table holding fill records before the run
// (on its kept table when kept), and purge expired ones.
type job struct {
	row         *row
	n           int
	kept        bool
	fill, purge int
}

func (p *plan) wants(r *row) bool { return p.only == nil || slices.Contains(p.only, r.name) }

// jobs lists the rows to run, size after size of -records: at size 0, every
// row at N (the small ones at the small N), then the flatness rows (no
// dedup, batched, and their floor) at flat N; at a larger size, the rows
// that can run on a kept table (fillable) at N. The purge rows follow the
// first size above 0 (or 0).
func (p *plan) jobs() []job {
	sizes := p.records
	if len(sizes) == 0 {
		sizes = []int{0}
	}
	purgeAt := sizes[0]
	if i := slices.IndexFunc(sizes, func(n int) bool { return n > 0 }); i >= 0 {
		purgeAt = sizes[i]
	}
	var js []job
	for _, fill := range sizes {
		js = append(js, p.jobsAt(fill)...)
		if p.purge > 0 && fill == purgeAt {
			for _, name := range purgeRows {
				if r := rowByName(name); p.wants(r) {
					js = append(js, job{row: r, n: p.n, kept: true, fill: fill, purge: p.purge})
				}
			}
		}
	}
	return js
}

// jobsAt lists the rows at table size fill.
func (p *plan) jobsAt(fill int) []job {
	wants := func(r *row) bool { return p.wants(r) && (fill == 0 || slices.Contains(fillable, r.name)) }
	var js []job
	for _, r := range rows {
		if !wants(r) || slices.Contains(repeated, r.name) {
			continue
		}
		n := p.n
		if r.small {
			n = p.smallN
		}
		js = append(js, job{row: r, n: n, kept: fill > 0, fill: fill})
	}
	sizes := []int{p.n}
	if p.flatN > 0 && p.flatN != p.n && fill == 0 {
		sizes = append(sizes, p.flatN)
	}
	for _, n := range sizes {
		for range max(p.repeat, 1) {
			for _, name := range repeated {
				if r := rowByName(name); wants(r) {
					js = append(js, job{row: r, n: n, kept: fill > 0, fill: fill})
				}
			}
		}
	}
	return js
}

// resultKey names a row's runs among all: row, N, table size, purge.
type resultKey struct {
	row                string
	n, records, purged int
}

func keyOf(r result) resultKey { return resultKey{r.Row, r.Records, r.TableRecords, r.PurgeExpired} }

// medians returns one result per row and N, in the order of rows (then N):
// the run of median events/s among the repeated ones.
func medians(rs []result) []result {
	runs := make(map[resultKey][]result)
	var order []resultKey
	for _, r := range rs {
		k := keyOf(r)
		if runs[k] == nil {
			order = append(order, k)
		}
		runs[k] = append(runs[k], r)
	}
	rank := func(name string) int { return slices.IndexFunc(rows, func(r *row) bool { return r.name == name }) }
	slices.SortStableFunc(order, func(a, b resultKey) int {
		if c := cmp.Or(cmp.Compare(a.records, b.records), cmp.Compare(a.purged, b.purged)); c != 0 {
			return c
		}
		if a.n != b.n {
			return b.n - a.n
		}
		return rank(a.row) - rank(b.row)
	})
	var out []result
	for _, k := range order {
		rr := runs[k]
		slices.SortFunc(rr, func(a, b result) int { return cmp.Compare(a.EventsPerSec, b.EventsPerSec) })
		m := rr[len(rr)/2]
		for _, r := range rr {
			if r.Check != "ok" {
				m = r // a failed run is reported, whatever the others did
			}
			m.Runs = append(m.Runs, r.EventsPerSec)
		}
		out = append(out, m)
	}
	return out
}

func (p *plan) unique(n int) int { return int(float64(n)*(1-p.dup) + 0.5) }

func topicFor(n int) string { return "events-" + strconv.Itoa(n) }

// report is the JSON document: how the run was made, and one result per row.
type report struct {
	Command    string  `json:"command"`
	Started    string  `json:"started"`
	GoVersion  string  `json:"go_version"`
	CPUs       int     `json:"cpus"`
	Postgres   string  `json:"postgres_version"`
	PGSettings string  `json:"postgres_settings"`
	Partitions int     `json:"partitions"`
	Duplicates float64 `json:"duplicate_share"`
	BatchWait  string  `json:"batch_wait"`
	// Load is the machine's load average (1 min) before and after the run:
	// everything shares its CPUs, other processes included.
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
	// Builds are the kept tables' fills (-records) and expired records
	// (-purge), with how long each took.
	Builds  []build  `json:"builds,omitempty"`
	Results []result `json:"results"`
}

func (p *plan) run(ctx context.Context, jsonPath string, quick bool) error {
	if p.dup < 0 || p.dup >= 1 {
		return fmt.Errorf("-duplicates %v: want a share in [0, 1)", p.dup)
	}
	began := time.Now()
	rep := report{
		Command:    strings.Join(append([]string{"dedupbench"}, os.Args[1:]...), " "),
		Started:    began.UTC().Format(time.RFC3339),
		GoVersion:  runtime.Version(),
		CPUs:       runtime.NumCPU(),
		Partitions: p.cfg.Partitions,
		Duplicates: p.dup,
		BatchWait:  p.cfg.BatchWait.String(),
		LoadBefore: loadAverage(),
	}
	var err error
	if rep.Postgres, rep.PGSettings, err = postgresInfo(ctx, p.cfg.Postgres); err != nil {
		return fmt.Errorf("PostgreSQL at %s: %w (run `make services`)", p.cfg.Postgres, err)
	}
	jobs := p.jobs()
	if len(jobs) == 0 {
		return errors.New("no rows to run")
	}

	var sizes []int
	for _, j := range jobs {
		if !j.row.sqs && !j.row.broker && !slices.Contains(sizes, j.n) {
			sizes = append(sizes, j.n)
		}
	}
	topics := make([]string, len(sizes))
	for i, n := range sizes {
		topics[i] = topicFor(n)
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(int32(p.cfg.Partitions), topics...))
	if err != nil {
		return fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	p.cfg.Brokers = strings.Join(cluster.ListenAddrs(), ",")
	for _, n := range sizes {
		t := time.Now()
		if err := p.produce(ctx, topicFor(n), n); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "produced %d records (%d events) to %s in %v\n", n, p.unique(n), topicFor(n), time.Since(t).Round(time.Millisecond))
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var kept *keptTables
	if slices.ContainsFunc(jobs, func(j job) bool { return j.kept }) {
		if kept, err = openKept(ctx, p.cfg); err != nil {
			return err
		}
		defer kept.close()
	}
	for _, j := range jobs {
		if j.kept {
			b, err := kept.prepare(ctx, j)
			if err != nil {
				return err
			}
			rep.Builds = append(rep.Builds, b...)
		}
		t := time.Now()
		res, err := p.runJob(ctx, self, j)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			res = result{Row: j.row.name, Title: j.row.title, Records: j.n, Unique: p.unique(j.n),
				TableRecords: j.fill, PurgeExpired: j.purge, Check: "FAILED: " + err.Error()}
		}
		fmt.Fprintf(os.Stderr, "  %-12s N=%-7d table %-9d %6.1fs  %s\n", j.row.name+purgeMark(j.purge), j.n, j.fill, time.Since(t).Seconds(), res.Check)
		rep.Results = append(rep.Results, res)
	}
	rep.Results = medians(rep.Results)
	fillRatios(rep.Results)
	rep.LoadAfter = loadAverage()

	fmt.Printf("\ndedupbench: %s, %d partitions, %.0f%% duplicates, %d CPUs, %s, PostgreSQL %s (%s); %v, load average %s -> %s\n\n",
		mode(quick), p.cfg.Partitions, p.dup*100, rep.CPUs, rep.GoVersion, rep.Postgres, rep.PGSettings,
		time.Since(began).Round(time.Second), rep.LoadBefore, rep.LoadAfter)
	for _, b := range rep.Builds {
		fmt.Printf("built %s\n", b)
	}
	if len(rep.Builds) > 0 {
		fmt.Println()
	}
	printTable(os.Stdout, rep.Results)
	out, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if jsonPath != "" {
		if err := os.WriteFile(jsonPath, append(out, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nJSON written to %s\n", jsonPath)
	} else {
		fmt.Printf("\n%s\n", out)
	}
	for _, r := range rep.Results {
		if r.Check != "ok" {
			return fmt.Errorf("row %s (N=%d): %s", r.Row, r.Records, r.Check)
		}
	}
	return nil
}

func mode(quick bool) string {
	if quick {
		return "quick mode"
	}
	return "full mode"
}

// runJob runs one row in a fresh process and returns its result.
func (p *plan) runJob(ctx context.Context, self string, j job) (result, error) {
	cfg := p.cfg
	cfg.Topic, cfg.Records, cfg.Unique = topicFor(j.n), j.n, p.unique(j.n)
	cfg.Kept, cfg.Fill, cfg.Purge = j.kept, j.fill, j.purge
	conf, err := json.Marshal(cfg)
	if err != nil {
		return result{}, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), childEnv+"="+j.row.name, configEnv+"="+string(conf))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return result{}, err
	}
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	var res result
	if err := json.Unmarshal(lines[len(lines)-1], &res); err != nil {
		return result{}, fmt.Errorf("reading its result: %w", err)
	}
	return res, nil
}

// fillRatios sets each row's ratio to its floor (see floorOf) at the same
// N and table size, or to that floor at its largest N at that size when
// there is none at its own.
func fillRatios(rs []result) {
	type at struct {
		floor      string
		n, records int
	}
	type of struct {
		floor   string
		records int
	}
	floors := map[at]float64{}
	best := map[of]int{}
	for _, r := range rs {
		if r.Row == floorOf(r.Row) && r.EventsPerSec > 0 && r.PurgeExpired == 0 {
			floors[at{r.Row, r.Records, r.TableRecords}] = r.EventsPerSec
			best[of{r.Row, r.TableRecords}] = max(best[of{r.Row, r.TableRecords}], r.Records)
		}
	}
	for i := range rs {
		floor, size := floorOf(rs[i].Row), rs[i].TableRecords
		f, ok := floors[at{floor, rs[i].Records, size}]
		if !ok {
			f = floors[at{floor, best[of{floor, size}], size}]
		}
		if f > 0 {
			rs[i].RatioToFloor = rs[i].EventsPerSec / f
		}
	}
}

// floorOf names the row a row is measured against: the least its store or
// queue can do with the same events. SQS, Pub/Sub, RabbitMQ, NATS and
// Lambda stream rows are measured against consuming the same queue,
// subscription, stream or invocations with no dedup,
// DynamoDB rows against a bare conditional write, the rest against
// PostgreSQL's bare insert.
func floorOf(row string) string {
	switch {
	case strings.HasPrefix(row, "sqs"):
		return "sqs-none"
	case strings.HasPrefix(row, "pubsub"):
		return "pubsub-none"
	case strings.HasPrefix(row, "dynamodb"):
		return "dynamodb-floor"
	case strings.HasPrefix(row, "amqp-quorum"):
		return "amqp-quorum-none"
	case strings.HasPrefix(row, "amqp"):
		return "amqp-none"
	case strings.HasPrefix(row, "nats"):
		return "nats-none"
	case strings.HasPrefix(row, "lambdastream"):
		return "lambdastream-none"
	case strings.HasPrefix(row, "redisstreams"):
		return "redisstreams-none"
	}
	return "floor"
}

// produce writes n records to topic, in eventOrder. Event i goes to
// partition i mod partitions, so its copies share a partition, as a
// producer's retries do.
func (p *plan) produce(ctx context.Context, topic string, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(p.cfg.Brokers, ",")...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchMaxBytes(64<<10))
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for k, i := range eventOrder(n, p.unique(n)) {
		id := eventID(i)
		recs[k] = &kgo.Record{
			Topic:     topic,
			Partition: int32(i % p.cfg.Partitions),
			Key:       []byte(id),
			Value:     eventBody(i),
			Headers:   []kgo.RecordHeader{{Key: kafkadedup.DefaultIDHeader, Value: []byte(id)}},
		}
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("produce to %s: %w", topic, err)
	}
	return nil
}

// eventOrder returns the events of records deliveries, by number: each of
// unique events once, then re-sends of random earlier ones, shuffled so that
// copies arrive interleaved. The seed is fixed: every run, and every row's
// transport, sees the same order.
func eventOrder(records, unique int) []int {
	rng := rand.New(rand.NewPCG(1, uint64(records)))
	ids := make([]int, 0, records)
	for i := range unique {
		ids = append(ids, i)
	}
	for len(ids) < records {
		ids = append(ids, rng.IntN(unique))
	}
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return ids
}

// eventID is event i's ID on every transport.
func eventID(i int) string { return "evt-" + strconv.Itoa(i) }

// eventBody is event i's payload on every transport.
func eventBody(i int) []byte {
	return fmt.Appendf(nil, `{"id":%d,"customer":%d,"cents":%d}`, i, i%997, 100+i%9973)
}

// loadAverage returns the one-minute load average, or "?".
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// postgresInfo returns the server's version and the settings that bound
// commit latency.
func postgresInfo(ctx context.Context, dsn string) (version, settings string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", "", err
	}
	defer conn.Close(context.Background())
	var fsync, syncCommit string
	err = conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit')`).
		Scan(&version, &fsync, &syncCommit)
	return version, "fsync=" + fsync + ", synchronous_commit=" + syncCommit, err
}
