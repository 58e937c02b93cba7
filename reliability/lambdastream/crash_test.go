package lambdastreamreliability_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/lambdastreamdedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/sqsbody"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashSize sizes the campaign: well under two minutes with -race on a
// busy two-core machine; DEDUP_SOAK=1 runs a long one.
type crashSize struct {
	events int
	procs  int
	shards int
	batch  int
	chaos  time.Duration // kills stop after this long
}

func crashSizing() crashSize {
	if crashtest.Soak() {
		return crashSize{events: 20000, procs: 4, shards: 6, batch: 100, chaos: 8 * time.Minute}
	}
	return crashSize{events: 2000, procs: 3, shards: 3, batch: 40, chaos: 50 * time.Second}
}

const (
	crashMaxAttempts = 4
	streamARN        = "arn:aws:kinesis:us-east-1:123456789012:stream/campaign"
)

// TestLambdaStreamCrashCampaign runs Lambda function processes of the
// Kinesis handler (transactional inbox on PostgreSQL, letters to an SQS
// queue) against a simulated Lambda service with stream semantics, and
// kills them with SIGKILL at random moments (mid-batch, mid-handler,
// mid-transaction) while about 30% of the events are in the stream twice
// (a producer's retried put) and 2% are poison, restarting each killed
// process. A killed invocation is a function error: Lambda retries its
// shard from the checkpoint with half the batch. At the end every shard's
// checkpoint is past its last record, every good event has exactly one
// effect, and every poison event has a letter naming its shard and
// sequence number, and no effect. The odd slots' processes wait in place for a
// record to retry, the even slots' report it at once.
func TestLambdaStreamCrashCampaign(t *testing.T) {
	size := crashSizing()
	rng := crashtest.Seeded(t)

	pool := testenv.Postgres(t)
	client := testenv.SQS(t)
	dlq := testenv.SQSQueue(t, client, map[string]string{"VisibilityTimeout": "300"})
	run := crashtest.RunID()
	ctx := context.Background()
	cfg := workerConfig{
		DSN:          testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		Table:        "lsrel_records_" + run,
		EffectsTable: crashtest.EffectsTable(t, pool, "lsrel_effects_"+run),
		Scope:        "lsrel-" + run,
		MaxAttempts:  crashMaxAttempts,
		SQSEndpoint:  testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
		DLQURL:       dlq,
	}
	store, err := dedup.NewPostgresStore(pool, dedup.WithTable(cfg.Table))
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+cfg.Table) })

	events, messages := crashtest.Plan(size.events, rng)
	poison := crashtest.Poison(events)
	good := len(events) - poison
	shards := kinesisShards(messages, size.shards)

	var f *crashtest.Fleet
	svc := newLambdaService(shards, size.batch, func(proc string) bool {
		return f.WasKilled(strings.Replace(proc, "-", "#", 1))
	})
	server := httptest.NewServer(svc)
	defer server.Close()
	host := strings.TrimPrefix(server.URL, "http://")
	start := time.Now()
	f = crashtest.NewFleet(t, workerEnv, size.procs, func(slot int, name string) any {
		c := cfg
		c.Name = name
		c.ReportAtOnce = slot%2 == 0 // the others wait in place for a record to retry
		c.RuntimeAPI = host + "/" + strings.Replace(name, "#", "-", 1)
		return c
	})
	watching := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			select {
			case <-watching:
				return
			case <-time.After(100 * time.Millisecond):
				svc.failDead()
			}
		}
	}()
	applied := func() int { return crashtest.Count(t, pool, cfg.EffectsTable, "effect") }
	done := func() bool { return svc.remaining() == 0 }

	// Chaos until every checkpoint is at its shard's end or the chaos time
	// is up.
	f.Chaos(rng, start, size.chaos, done, func() {
		t.Logf("%v: kills=%d effects=%d/%d records left=%d", time.Since(start).Round(time.Second), f.Kills(), applied(), good, svc.remaining())
	})
	// Settling is bounded by its progress (crashtest.Stall), not by a fixed
	// time: a loaded machine makes it slower, not wrong.
	crashtest.Await(t, "every shard read to its end after the chaos", done,
		func() int { return len(messages) - svc.remaining() }, func() string {
			return fmt.Sprintf("effects %d/%d, records left %d", applied(), good, svc.remaining())
		})
	f.Finish()
	close(watching)
	<-watched
	stats, protocol := svc.snapshot()
	for _, e := range protocol {
		t.Errorf("Lambda would reject a response: %s", e)
	}

	letters := readLetters(t, client, dlq)
	crashtest.Verdict(t, "Lambda stream", pool, cfg.EffectsTable, events, len(messages), letters, f, time.Since(start))
	t.Logf("Lambda service: %d shards; invocations %d, function errors %d (bisected %d), item failures reported %d",
		size.shards, stats.invocations, stats.functionErrors, stats.bisections, stats.itemFailures)
	if stats.functionErrors == 0 {
		t.Errorf("no kill landed mid-invocation (kills %d, function errors %d): the campaign proved nothing",
			f.Kills(), stats.functionErrors)
	}
	if stats.itemFailures == 0 {
		t.Error("no batch item failure reported: the retry from a reported sequence number went untested")
	}
}

// kinesisShards puts each message in a record of the shard its partition
// key (the event ID) hashes to, as Kinesis does, with increasing sequence
// numbers; the data names the event and whether it is poison.
func kinesisShards(messages []crashtest.Event, n int) [][]events.KinesisEventRecord {
	shards := make([][]events.KinesisEventRecord, n)
	for i, m := range messages {
		h := fnv.New32a()
		_, _ = h.Write([]byte(m.ID))
		s := int(h.Sum32() % uint32(n))
		seq := fmt.Sprintf("49590338271490256608559692538361571095921575989136%06d", i)
		shards[s] = append(shards[s], events.KinesisEventRecord{
			EventID: fmt.Sprintf("shardId-%012d:%s", s, seq), EventName: "aws:kinesis:record", EventSource: "aws:kinesis",
			EventVersion: "1.0", EventSourceArn: streamARN, AwsRegion: "us-east-1",
			Kinesis: events.KinesisRecord{
				PartitionKey: m.ID, SequenceNumber: seq, KinesisSchemaVersion: "1.0",
				Data: fmt.Appendf(nil, `{"event":%q,"poison":%t}`, m.ID, m.Poison),
			},
		})
	}
	return shards
}

// readLetters receives every letter of the DLQ and returns their number per
// event ID, failing t for a letter without its metadata or its place in
// the stream.
func readLetters(t *testing.T, client *sqs.Client, url string) map[string]int {
	t.Helper()
	letters := map[string]int{}
	for empty := 0; empty < 2; {
		out, err := client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
		}, sqsbody.KeepConnection)
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Messages) == 0 {
			empty++
			continue
		}
		for _, m := range out.Messages {
			meta, err := sqsdedup.DeadLetterMetadata(m)
			if err != nil {
				t.Fatal(err)
			}
			id := meta["dedup-event-id"]
			letters[id]++
			shard, seq := attr(m, lambdastreamdedup.HeaderShard), attr(m, lambdastreamdedup.HeaderSequence)
			if !crashtest.PoisonReason(meta["dedup-reason"]) || meta["dedup-origin-stream"] != streamARN ||
				!strings.HasPrefix(shard, "shardId-") || len(seq) != 56 || !strings.Contains(aws.ToString(m.Body), id) ||
				attr(m, lambdastreamdedup.HeaderPartitionKey) != id {
				t.Errorf("letter %s: metadata %v, shard %q, sequence %q, body %q", id, meta, shard, seq, aws.ToString(m.Body))
			}
		}
	}
	return letters
}

func attr(m types.Message, name string) string {
	return aws.ToString(m.MessageAttributes[name].StringValue)
}
