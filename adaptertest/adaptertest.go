// Package adaptertest is the conformance suite every transport adapter's
// consumer must pass, and the test helpers the adapters' own tests share.
//
// An adapter's test supplies a [Harness]: a queue or topic of its own on a
// real (or in-process) broker, a way to publish to it, to start the
// adapter's consumer over a given store, handler and options, to read back
// its dead-letter destination, and to break the consumer's connection. [Run]
// then checks, against the broker, what the SDK promises whatever the
// transport: one effect per event, poison and permanent failures
// dead-lettered with their metadata, conflicts parked, a bounded shutdown
// that loses nothing, a consumer that outlives its connection, and an honest
// Health. [Features] says what a broker lacks; a case it rules out is
// skipped by name, with the reason.
//
// The model is watermill's TestPubSub(t, features, constructor).
package adaptertest

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
)

// Deadline bounds every wait for an effect: generous, so that a loaded
// machine slows a case down without failing it.
const Deadline = 60 * time.Second

// MaxAttempts is the dedup.WithMaxAttempts every consumer the suite starts
// runs with.
const MaxAttempts = 3

// ShutdownTimeout is what [Config.ShutdownTimeout] is set to: how long a
// handler may run on after Run's context is done.
const ShutdownTimeout = time.Second

// Message is one message as the suite publishes it and a handler sees it.
type Message struct {
	// ID is the event ID, carried where the adapter reads it by default.
	ID string
	// Payload is the body.
	Payload []byte
	// Headers are extra headers or attributes, if the broker has them.
	Headers map[string]string
}

// Handler is what a consumer the suite starts runs for each delivery, read
// as a [Message]: dedup.Handler without the transport's type.
type Handler func(ctx context.Context, m Message) error

// Config is what a consumer the suite starts runs with.
type Config struct {
	// Store is the wrapper's store.
	Store dedup.Store
	// Handler is the wrapper's handler.
	Handler Handler
	// Options are the wrapper's options (scope, attempts, backoff, lease,
	// outage threshold, observer); they come after the harness's own, so
	// [Wrap] puts the harness's dead-letter sink first.
	Options []dedup.Opt
	// ShutdownTimeout is how long a running handler may go on once Run's
	// context is done (the adapter's WithShutdownTimeout or
	// WithDrainTimeout).
	ShutdownTimeout time.Duration
}

// Consumer is an adapter's consumer, as every adapter has it.
type Consumer interface {
	// Run consumes until ctx is done, then shuts down and returns.
	Run(ctx context.Context) error
	// Health returns nil, or an error while the consumer cannot settle
	// messages.
	Health() error
}

// Letter is a message read back from a harness's dead-letter destination,
// with the SDK's metadata.
type Letter struct {
	EventID  string
	Reason   dedup.Reason
	Attempts int
	Payload  []byte
	// Metadata holds every dedup-* header or attribute of the letter.
	Metadata map[string]string
}

// Harness is one adapter's broker as the suite sees it: a queue or topic of
// its own (with its dead-letter destination), made afresh for each case by
// the constructor given to [Run]. Its methods fail t on an error of the
// broker's.
type Harness interface {
	// Publish sends msgs, in order, to the harness's queue, and returns
	// once the broker holds them; a copy of an ID already published is
	// published again, as a producer retrying would.
	Publish(t *testing.T, msgs ...Message)
	// NewConsumer returns a consumer of the harness's queue running cfg,
	// not yet running; several may run at once and share the queue unless
	// Features.SingleConsumer. The consumer's dead letters go to the
	// harness's dead-letter destination.
	NewConsumer(t *testing.T, cfg Config) Consumer
	// DeadLetters returns every letter in the dead-letter destination so
	// far, however often it is called.
	DeadLetters(t *testing.T) []Letter
	// Unsettled returns how many published messages the broker has not had
	// acknowledged (offsets not committed, messages not deleted). The suite
	// calls it with no consumer running and waits for 0, so a count may lag.
	Unsettled(t *testing.T) int
	// BreakConnection breaks the connection of the harness's consumers to
	// the broker, for running ones and new ones alike, until restore is
	// called; it returns once a consumer's call has failed or its
	// connection is closed. The harness's own publishing and reading may
	// fail meanwhile. Not called when Features.NoConnectionLoss.
	BreakConnection(t *testing.T) (restore func())
}

// Features says what a broker or its harness lacks, or has beyond the
// rest; the zero value is a broker with everything the suite asks for.
type Features struct {
	// NoConnectionLoss: the harness cannot break a consumer's connection;
	// the ConnectionLoss case is skipped.
	NoConnectionLoss bool
	// SingleConsumer: consumers cannot share the queue; the Duplicates case
	// runs one consumer instead of several.
	SingleConsumer bool
	// HealthCoversBroker: Health also reports the broker unreachable (not
	// only the store or the dead-letter sink failing), which the
	// ConnectionLoss case then checks.
	HealthCoversBroker bool
	// IgnoreGoroutines names functions that may be on the stack of a
	// goroutine outliving a Run by design (an HTTP client's idle
	// connections, "net/http.(*persistConn).readLoop"): the Shutdown case's
	// leak check ignores those goroutines.
	IgnoreGoroutines []string
}

// testCase is one case of the suite.
type testCase struct {
	name string
	run  func(t *testing.T, f Features, h Harness)
	// skip says why the case cannot run on a broker with f, or "".
	skip func(f Features) string
}

var cases = []testCase{
	{name: "Duplicates", run: testDuplicates},
	{name: "PoisonAfterMaxAttempts", run: testPoison},
	{name: "PermanentError", run: testPermanent},
	{name: "FingerprintConflict", run: testConflict},
	{name: "ConnectionLoss", run: testConnectionLoss, skip: func(f Features) string {
		if f.NoConnectionLoss {
			return "the harness cannot break a consumer's connection (Features.NoConnectionLoss)"
		}
		return ""
	}},
	{name: "Health", run: testHealth},
}

// Run checks an adapter against the suite, one subtest per case, each with
// a harness of its own from newHarness. The Shutdown case runs first and
// alone, since it counts goroutines; the others then run in parallel. Run
// must not be called from a parallel test, and returns once every case has
// finished.
func Run(t *testing.T, f Features, newHarness func(t *testing.T) Harness) {
	t.Helper()
	t.Run("adaptertest", func(t *testing.T) {
		t.Run("Shutdown", func(t *testing.T) {
			testShutdown(t, f, newHarness(t))
		})
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				if c.skip != nil {
					if reason := c.skip(f); reason != "" {
						t.Skip(reason)
					}
				}
				c.run(t, f, newHarness(t))
			})
		}
	})
}

// newScope returns a dedup scope no other case or earlier run has used.
func newScope(t *testing.T) string {
	name := t.Name()
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	return "adaptertest." + name + "." + strings.ToLower(rand.Text()[:10])
}
