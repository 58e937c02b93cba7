package sqsreliability_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/crashtest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// crashSize sizes the crash campaign.
type crashSize struct {
	events   int           // distinct events
	procs    int           // worker processes at once
	handlers int           // handlers per process
	produce  time.Duration // the events are sent over this long
	chaos    time.Duration // kills stop after this long
}

// crashSizing fits the default campaign in about two minutes with -race on
// a busy two-core machine; DEDUP_SOAK=1 runs a long one.
func crashSizing() crashSize {
	if soak() {
		return crashSize{events: 30000, procs: 4, handlers: 8, produce: 5 * time.Minute, chaos: 8 * time.Minute}
	}
	return crashSize{events: 3000, procs: 3, handlers: 8, produce: 25 * time.Second, chaos: 60 * time.Second}
}

const (
	crashMaxAttempts = 5
	// crashVisibility is the queue's visibility timeout, in seconds: a
	// killed worker's messages come back this long after its last heartbeat,
	// and the store lease (which the consumer takes from it) runs out then.
	crashVisibility = 2
)

// TestSQSCrashCampaign runs worker processes of one queue, on fauxqs with
// the DynamoDB store, and kills them with SIGKILL at random moments (mid-
// handler included) while about 30% of the events arrive twice and 2% are
// poison, restarting each killed worker. At the end every good event has at
// least one effect and every poison event is in the DLQ with its metadata
// and no effect; effects applied twice are counted and each must be
// explained by a kill of the worker that applied the earlier one, between
// its effect and its Complete.
func TestSQSCrashCampaign(t *testing.T) {
	size := crashSizing()
	rng := crashtest.Seeded(t)

	c := testenv.SQS(t)
	ddb := testenv.DynamoDB(t)
	pool := testenv.Postgres(t)
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": strconv.Itoa(crashVisibility)})
	dlq := testenv.SQSQueue(t, c, nil)
	cfg := workerConfig{
		SQSEndpoint:      testenv.Env("DEDUP_SQS_ENDPOINT", "http://127.0.0.1:4566"),
		QueueURL:         url,
		DLQURL:           dlq,
		DynamoDBEndpoint: testenv.Env("DEDUP_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"),
		Table:            dynamoDBTable(t, ddb),
		DSN:              testenv.Env("DEDUP_POSTGRES_DSN", testenv.DefaultPostgresDSN),
		EffectsTable:     effectsTable(t, pool),
		Scope:            "sqsrel-crash-" + runID(),
		MaxAttempts:      crashMaxAttempts,
		Workers:          size.handlers,
	}
	p := newPlan("evt", size.events, 0.3, 0.02, rng)

	start := time.Now()
	f := crashtest.NewFleet(t, workerEnv, size.procs, func(_ int, name string) any {
		c := cfg
		c.Name = name
		return c
	})
	produced := produceOver(c, url, p.messages, size.produce)
	var produceErr error
	producing := true
	done := func() bool {
		if producing {
			select {
			case produceErr = <-produced:
				producing = false
			default:
				return false
			}
		}
		if produceErr != nil {
			t.Fatalf("producing: %v", produceErr)
		}
		// Every poison event's letter too: a queue that counts nothing for a
		// moment (an emulator under load) does not end the run early.
		return queueTotal(t, c, url) == 0 && countEffects(t, pool, cfg.EffectsTable) == p.good() &&
			queueTotal(t, c, dlq) >= p.poison
	}

	f.Chaos(rng, start, size.chaos, done, func() {
		t.Logf("%v: kills=%d effects=%d/%d queue=%d", time.Since(start).Round(time.Second), f.Kills(),
			countEffects(t, pool, cfg.EffectsTable), p.good(), queueTotal(t, c, url))
	})
	chaosEnded := time.Since(start)
	// Settling is bounded by its progress, not by a fixed time: at a load
	// average of 10 a run was still settling 25 events a second when a
	// fixed minute ran out.
	settled := func() int { return countEffects(t, pool, cfg.EffectsTable) - queueTotal(t, c, url) }
	crashtest.Await(t, "every event settled after the chaos", done, settled, func() string {
		return fmt.Sprintf("effects %d/%d, queue %d", countEffects(t, pool, cfg.EffectsTable), p.good(), queueTotal(t, c, url))
	})
	f.Finish()
	elapsed := time.Since(start)

	fig := crashFigures(p, f, cfg.Scope, readRows(t, pool, cfg.EffectsTable), letters(t, drainDLQ(t, c, dlq)))
	fig.elapsed, fig.chaos = elapsed, chaosEnded
	statusOf, maxGood := recordStatuses(t, ddb, cfg.Table)
	fig.maxGoodAttempts = maxGood
	t.Logf("SQS crash campaign: %s", fig)

	if fig.lost > 0 {
		t.Errorf("%d events lost: %v", fig.lost, fig.lostIDs)
	}
	if fig.poisonApplied > 0 || fig.goodDeadLettered > 0 {
		t.Errorf("%d poison events applied, %d good events dead-lettered", fig.poisonApplied, fig.goodDeadLettered)
	}
	if len(fig.unexplained) > 0 {
		t.Errorf("%d events applied twice without a kill between effect and Complete, or a lost lease: %v", len(fig.unexplained), fig.unexplained)
	}
	if fig.badLetters > 0 {
		t.Errorf("%d dead letters with unexpected metadata", fig.badLetters)
	}
	if fig.kills == 0 || fig.cutBefore+fig.twiceAfterKill == 0 {
		t.Errorf("no kill landed mid-handler (kills %d): the campaign proved nothing", fig.kills)
	}
	for _, e := range p.events {
		want := dedup.StatusSucceeded
		if e.poison {
			want = dedup.StatusFailedFinal
		}
		if got := statusOf[e.id]; got != want {
			t.Errorf("record of %s is %q, want %q", e.id, got, want)
		}
	}
	if n := queueTotal(t, c, url); n != 0 {
		t.Errorf("queue still holds %d messages", n)
	}
}

// crashCounts are what the crash campaign counts at its end.
type crashCounts struct {
	events, messages, dups, poison int
	kills, restarts                int
	starts                         int // handler runs started
	effects                        int // effect rows
	reruns                         int // handler runs of a good event after its first
	cutBefore                      int // runs of a killed worker that never reached their effect
	deadLetters                    int
	parked                         int // distinct events dead-lettered
	extraLetters                   int // dead letters beyond one per event (killed between DLQ send and Fail)
	lost                           int
	lostIDs                        []string
	appliedTwice                   int // good events with more than one effect
	twiceAfterKill                 int // ... whose earlier effects' workers were all killed
	twiceAfterLeaseLost            int // ... else whose lease a live worker lost mid-handler
	unexplained                    []string
	goodDeadLettered               int
	poisonApplied                  int
	badLetters                     int
	maxGoodAttempts                int // highest attempt count of a good event's record
	reasons                        map[string]int
	chaos, elapsed                 time.Duration
}

func (c crashCounts) String() string {
	var reasons []string
	for r, n := range c.reasons {
		reasons = append(reasons, fmt.Sprintf("%s=%d", r, n))
	}
	slices.Sort(reasons)
	return fmt.Sprintf("events=%d messages=%d duplicates_injected=%d poison=%d kills=%d restarts=%d "+
		"handler_starts=%d reruns=%d cut_before_effect=%d effects=%d dead_letters=%d dead_lettered_events=%d "+
		"extra_dead_letters=%d reasons=[%s] lost=%d applied_twice=%d applied_twice_after_kill=%d "+
		"applied_twice_after_lease_lost=%d applied_twice_unexplained=%d good_dead_lettered=%d poison_applied=%d max_good_attempts=%d "+
		"chaos=%v elapsed=%v",
		c.events, c.messages, c.dups, c.poison, c.kills, c.restarts,
		c.starts, c.reruns, c.cutBefore, c.effects, c.deadLetters, c.parked,
		c.extraLetters, strings.Join(reasons, " "), c.lost, c.appliedTwice, c.twiceAfterKill,
		c.twiceAfterLeaseLost, len(c.unexplained), c.goodDeadLettered, c.poisonApplied, c.maxGoodAttempts,
		c.chaos.Round(time.Second), c.elapsed.Round(time.Second))
}

func crashFigures(p *plan, f *crashtest.Fleet, scope string, rows map[string][]row, dl map[string][]map[string]string) crashCounts {
	c := crashCounts{events: len(p.events), messages: len(p.messages), dups: p.dups, poison: p.poison,
		kills: f.Kills(), restarts: f.Restarts(), reasons: map[string]int{}}
	leaseLost := leaseLost(f)
	for _, e := range p.events {
		var effects []string
		runs := 0
		open := map[string]bool{} // workers with a start not yet followed by their effect
		for _, r := range rows[e.id] {
			switch r.kind {
			case "start":
				c.starts++
				runs++
				open[r.worker] = true
			case "effect":
				effects = append(effects, r.worker)
				delete(open, r.worker)
			}
		}
		c.effects += len(effects)
		letters := dl[e.id]
		c.deadLetters += len(letters)
		if len(letters) > 0 {
			c.parked++
			c.extraLetters += len(letters) - 1
		}
		for _, meta := range letters {
			c.reasons[meta["dedup-reason"]]++
			if !goodLetter(meta) {
				c.badLetters++
			}
		}
		switch {
		case e.poison && len(effects) > 0:
			c.poisonApplied++
		case e.poison && len(letters) == 0:
			c.lost++
			c.lostIDs = append(c.lostIDs, e.id)
		case e.poison:
		case len(letters) > 0:
			c.goodDeadLettered++
		case len(effects) == 0:
			c.lost++
			c.lostIDs = append(c.lostIDs, e.id)
		}
		if e.poison {
			continue
		}
		c.reruns += max(runs-1, 0)
		for w := range open {
			if f.WasKilled(w) {
				c.cutBefore++
			}
		}
		if len(effects) > 1 {
			c.appliedTwice++
			explained := true
			for _, w := range effects[:len(effects)-1] {
				explained = explained && f.WasKilled(w)
			}
			switch {
			case explained:
				c.twiceAfterKill++
			case leaseLost[dedup.Key{Scope: scope, EventID: e.id}.String()]:
				// A live worker stalled past its lease: fenced, and reported.
				c.twiceAfterLeaseLost++
			default:
				c.unexplained = append(c.unexplained, fmt.Sprintf("%s%v", e.id, effects))
			}
		}
	}
	return c
}

// goodLetter reports whether a poison event's dead letter says what it
// should: why, and after how many attempts.
func goodLetter(meta map[string]string) bool {
	attempts, _ := strconv.Atoi(meta["dedup-attempts"])
	switch meta["dedup-reason"] {
	case string(dedup.ReasonHandlerError):
		// The durable count, or SQS's receive count when that is higher.
		return attempts >= crashMaxAttempts && strings.Contains(meta["dedup-cause"], "poison")
	case string(dedup.ReasonCrashLoop):
		// Its last attempt was cut by a kill: parked without running again.
		return attempts > crashMaxAttempts
	}
	return false
}

// recordStatuses reads every record of a DynamoDB dedup table: the status by
// event ID and the highest attempt count among records that succeeded.
func recordStatuses(t *testing.T, client *dynamodb.Client, table string) (map[string]dedup.Status, int) {
	t.Helper()
	statuses := map[string]dedup.Status{}
	maxAttempts := 0
	pages := dynamodb.NewScanPaginator(client, &dynamodb.ScanInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(context.Background())
		if err != nil {
			t.Fatalf("scan %s: %v", table, err)
		}
		for _, item := range page.Items {
			id, _ := item["event_id"].(*ddbtypes.AttributeValueMemberS)
			status, _ := item["status"].(*ddbtypes.AttributeValueMemberS)
			attempts, _ := item["attempts"].(*ddbtypes.AttributeValueMemberN)
			if id == nil || status == nil || attempts == nil {
				t.Errorf("unreadable record %v", item)
				continue
			}
			statuses[id.Value] = dedup.Status(status.Value)
			if n, _ := strconv.Atoi(attempts.Value); status.Value == string(dedup.StatusSucceeded) {
				maxAttempts = max(maxAttempts, n)
			}
		}
	}
	return statuses, maxAttempts
}
