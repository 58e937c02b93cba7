package sqsdedup_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// A message without an event ID is dead-lettered with a line naming it by
// its queue URL and message ID, though it has no key.
func TestInvalidIDLetterLogNamesTheMessage(t *testing.T) {
	t.Parallel()
	c := client(t)
	url := queue(t, c)
	logs := testenv.NewJSONLogs(t)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(context.Context, types.Message) error { return nil },
		dedup.WithLogger(logs.Logger(slog.LevelInfo)))
	start(t, c, url, w)
	out, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String("{}")})
	if err != nil {
		t.Fatal(err)
	}
	const msg = "dedup: message dead-lettered"
	adaptertest.WaitFor(t, adaptertest.Deadline, "the dead-letter line", func() bool { return len(logs.Lines(msg)) > 0 })
	line := logs.Lines(msg)[0]
	want := map[string]any{"queue_url": url, "message_id": aws.ToString(out.MessageId)}
	if origin, _ := line["origin"].(map[string]any); len(origin) != 2 || origin["queue_url"] != want["queue_url"] ||
		origin["message_id"] != want["message_id"] {
		t.Errorf("origin %#v, want %v", line["origin"], want)
	}
	if line["reason"] != string(dedup.ReasonInvalidID) {
		t.Errorf("reason %v, want %s", line["reason"], dedup.ReasonInvalidID)
	}
}
