package pubsubdedup_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/pubsubdedup"
)

// A letter keeps within Pub/Sub's attribute limits: a metadata value over
// 1024 bytes (a long error) is cut at a character boundary. The body, the
// ordering key and the origin are kept.
func TestSinkAttributeLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, subConfig{})
	sink := e.sink(t)
	ctx := context.Background()
	long := strings.Repeat("é", 600) // 1200 bytes
	if err := sink.Send(ctx, dedup.DeadLetter{Payload: []byte("small"), MessageKey: []byte("k-1"), Reason: dedup.ReasonPanic,
		Error: long, EventID: "e-1", Scope: "s", Attempts: 1, LastFailure: time.Now(), Origin: dedup.Origin{MessageID: "m-1"}}); err != nil {
		t.Fatal(err)
	}
	letters := e.letters()
	if len(letters) != 1 {
		t.Fatalf("%d letters, want 1", len(letters))
	}
	small := letters[0]
	if v := small.Attributes["dedup-error"]; len(v) > pubsubdedup.MaxAttributeValue || !strings.HasPrefix(long, v) || len(v) < 1000 {
		t.Errorf("dedup-error of %d bytes, want the error cut to at most %d at a character boundary", len(v), pubsubdedup.MaxAttributeValue)
	}
	if small.OrderingKey != "k-1" || string(small.Data) != "small" || small.Attributes[pubsubdedup.OriginMessageIDAttribute] != "m-1" {
		t.Errorf("letter: key %q, data %q, origin %q; want the original's", small.OrderingKey, small.Data, small.Attributes[pubsubdedup.OriginMessageIDAttribute])
	}
}
