package lambdastreamreliability_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-lambda-go/events"
)

// shard is one Kinesis shard as the Lambda service reads it for an event
// source mapping: its records, the checkpoint, and the size of the next
// batch (halved after a function error: BisectBatchOnFunctionError).
type shard struct {
	records []events.KinesisEventRecord
	pos     int
	limit   int
	busy    bool
}

// invocation is a batch handed to a function process.
type invocation struct {
	shard *shard
	batch []events.KinesisEventRecord
	proc  string // the process polling the path it was handed on
}

// lambdaService serves the Lambda Runtime API to the campaign's function
// processes (each polls a path of its own, /<process>/2018-06-01/...) and
// plays the Lambda service for a Kinesis event source mapping with
// ReportBatchItemFailures: one invocation per shard at a time; a response
// moves the shard's checkpoint past the batch, or to the sequence number of
// its one batch item failure; a function error (the process was killed
// mid-invocation) retries from the checkpoint with half the batch.
type lambdaService struct {
	batchSize int
	killed    func(proc string) bool // whether the process was killed

	mu       sync.Mutex
	shards   []*shard
	inflight map[string]*invocation
	nextID   int
	errors   []string // protocol errors: a response Lambda would reject
	stats    serviceStats
	wake     chan struct{}
}

type serviceStats struct{ invocations, responses, functionErrors, bisections, itemFailures int }

func newLambdaService(shards [][]events.KinesisEventRecord, batchSize int, killed func(string) bool) *lambdaService {
	s := &lambdaService{batchSize: batchSize, killed: killed, inflight: map[string]*invocation{}, wake: make(chan struct{})}
	for _, recs := range shards {
		s.shards = append(s.shards, &shard{records: recs, limit: batchSize})
	}
	return s
}

// ServeHTTP answers next, response and error calls of the Runtime API.
func (s *lambdaService) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	proc, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/2018-06-01/runtime/invocation/")
	switch {
	case r.Method == http.MethodGet && rest == "next":
		s.next(w, r, proc)
	case r.Method == http.MethodPost && strings.HasSuffix(rest, "/response"):
		var resp events.KinesisEventResponse
		if err := json.NewDecoder(r.Body).Decode(&resp); err != nil {
			s.protocolError("response of %s: %v", rest, err)
		}
		s.settle(strings.TrimSuffix(rest, "/response"), &resp)
		w.WriteHeader(http.StatusAccepted)
	case r.Method == http.MethodPost && strings.HasSuffix(rest, "/error"):
		s.protocolError("invocation %s: the handler returned an error", rest)
		s.settle(strings.TrimSuffix(rest, "/error"), nil)
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, r)
	}
}

// next hands the process the next batch of a shard with none in flight,
// waiting until there is one.
func (s *lambdaService) next(w http.ResponseWriter, r *http.Request, proc string) {
	for {
		s.mu.Lock()
		wake := s.wake
		if !s.killed(proc) {
			for _, sh := range s.shards {
				if sh.busy || sh.pos == len(sh.records) {
					continue
				}
				sh.busy = true
				s.nextID++
				id := strconv.Itoa(s.nextID)
				inv := &invocation{shard: sh, batch: sh.records[sh.pos:min(sh.pos+sh.limit, len(sh.records))], proc: proc}
				s.inflight[id] = inv
				s.stats.invocations++
				s.mu.Unlock()
				w.Header().Set("Lambda-Runtime-Aws-Request-Id", id)
				w.Header().Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10))
				w.Header().Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:campaign")
				_ = json.NewEncoder(w).Encode(events.KinesisEvent{Records: inv.batch})
				return
			}
		}
		s.mu.Unlock()
		select {
		case <-wake:
		case <-time.After(200 * time.Millisecond): // a kill is noticed by failDead
		case <-r.Context().Done():
			return
		}
	}
}

// settle applies an invocation's response, or a function error when resp
// is nil.
func (s *lambdaService) settle(id string, resp *events.KinesisEventResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	inv := s.inflight[id]
	if inv == nil {
		return // already failed: its process was killed
	}
	delete(s.inflight, id)
	sh := inv.shard
	sh.busy = false
	defer s.signal()
	if resp == nil {
		s.stats.functionErrors++
		if len(inv.batch) > 1 {
			s.stats.bisections++
		}
		sh.limit = max(1, len(inv.batch)/2)
		return
	}
	s.stats.responses++
	sh.limit = s.batchSize
	switch len(resp.BatchItemFailures) {
	case 0:
		sh.pos += len(inv.batch)
	case 1:
		seq := resp.BatchItemFailures[0].ItemIdentifier
		i := slices.IndexFunc(inv.batch, func(r events.KinesisEventRecord) bool { return r.Kinesis.SequenceNumber == seq })
		if i < 0 {
			s.errors = append(s.errors, fmt.Sprintf("batch item failure %q names no record of the batch", seq))
			return
		}
		s.stats.itemFailures++
		sh.pos += i
	default:
		s.errors = append(s.errors, fmt.Sprintf("%d batch item failures for one shard", len(resp.BatchItemFailures)))
	}
}

// failDead fails the invocations of killed processes, as Lambda does when
// a function's runtime exits mid-invocation.
func (s *lambdaService) failDead() {
	s.mu.Lock()
	var dead []string
	for id, inv := range s.inflight {
		if s.killed(inv.proc) {
			dead = append(dead, id)
		}
	}
	s.mu.Unlock()
	for _, id := range dead {
		s.settle(id, nil)
	}
}

// signal wakes the waiting next calls; s.mu is held.
func (s *lambdaService) signal() {
	close(s.wake)
	s.wake = make(chan struct{})
}

func (s *lambdaService) protocolError(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errors = append(s.errors, fmt.Sprintf(format, args...))
}

// remaining returns the records past no shard's checkpoint yet.
func (s *lambdaService) remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sh := range s.shards {
		n += len(sh.records) - sh.pos
	}
	return n
}

func (s *lambdaService) snapshot() (serviceStats, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats, slices.Clone(s.errors)
}
