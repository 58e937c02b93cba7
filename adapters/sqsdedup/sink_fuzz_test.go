package sqsdedup_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adapters/sqsdedup"
)

// FuzzSinkInput builds dead letters from fuzzed fields and original
// attributes and checks the SendMessageInput a Sink makes of them, without
// sending it: never more than 10 attributes, no original attribute dropped,
// every metadata field readable back with DeadLetterMetadata, the body
// unchanged, and every refusal justified (a size error typed, with the size
// the letter really has).
func FuzzSinkInput(f *testing.F) {
	// Fields of meta, separated by '|': reason, error, cause, error type,
	// cause type, event ID, scope, origin queue or topic, origin message ID
	// or group, message key. attrs holds original attributes separated by
	// 0xff: a control byte (type, name tricks), then the value.
	f.Add([]byte(`{"order":1}`), []byte("\x01v1\xff\x02v2"), "handler-error|boom|boom|*errors.errorString|*errors.errorString|evt-1|orders|https://sqs/q|m-1|", int64(3), uint8(0), uint32(0))
	f.Add([]byte("x"), []byte("\x00a\xff\x00b\xff\x00c\xff\x00d\xff\x00e\xff\x00f\xff\x00g\xff\x00h\xff\x00i"), "panic|p||||evt-2|s|orders|7|k", int64(5), uint8(2), uint32(0))
	f.Add([]byte("x"), []byte("\x03\x00\xff\xfe\xff\x0bold\xff\x0dtwin"), "permanent|bad \x00 byte|\xff|||évènement|s\x7f|q|m|", int64(1), uint8(1), uint32(300))
	f.Add(bytes.Repeat([]byte("p"), 2000), []byte("\x01v"), "r|e|c|||id|s|q|m|", int64(1), uint8(0), uint32(1024))
	f.Add([]byte{}, []byte{}, "", int64(0), uint8(4), uint32(1))

	f.Fuzz(func(t *testing.T, payload, attrs []byte, meta string, attempts int64, flags uint8, limit uint32) {
		dl, originals := fuzzedLetter(payload, attrs, meta, attempts, flags)
		dlq := "https://sqs.us-east-1.amazonaws.com/000000000000/dlq"
		if flags&1 != 0 {
			dlq += ".fifo"
		}
		max := sqsdedup.DefaultMaxMessageSize
		if limit > 0 {
			max = int(limit%(1<<20)) + 1
		}
		in, err := sqsdedup.SinkInput(offlineSink(t, dlq, max), dl)

		if err != nil {
			checkRefusal(t, dl, originals, dlq, max, err)
			return
		}
		if reason := unsendable(dl, originals); reason != "" {
			t.Fatalf("accepted a letter whose %s", reason)
		}
		if n := len(in.MessageAttributes); n > 10 {
			t.Fatalf("%d attributes", n)
		}
		if got := aws.ToString(in.MessageBody); got != string(dl.Payload) {
			t.Fatalf("body %q, want %q", got, dl.Payload)
		}
		if size := inputSize(in); size > max {
			t.Fatalf("accepted a letter of %d bytes over the limit of %d", size, max)
		}
		checkOriginals(t, in, originals)
		checkReadBack(t, in, dl)
		if strings.HasSuffix(dlq, ".fifo") {
			g, d := aws.ToString(in.MessageGroupId), aws.ToString(in.MessageDeduplicationId)
			if !fifoID(g) || !fifoID(d) {
				t.Fatalf("FIFO group %q or deduplication ID %q is not 1 to 128 printable ASCII characters", g, d)
			}
		}
	})
}

// fuzzedLetter builds a dead letter from the fuzzer's values, and returns
// it with the original attributes a Sink must keep (those not named
// dedup-*), by name, the last of a repeated name winning.
func fuzzedLetter(payload, attrs []byte, meta string, attempts int64, flags uint8) (dedup.DeadLetter, []dedup.Header) {
	f := strings.Split(meta, "|")
	field := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	dl := dedup.DeadLetter{
		Payload: payload, MessageKey: []byte(field(9)),
		Reason: dedup.Reason(field(0)), Error: field(1), Cause: field(2), ErrorType: field(3), CauseType: field(4),
		Attempts: int(attempts), EventID: field(5), Scope: field(6),
		FirstFailure: time.Unix(1700000000, 5).UTC(), LastFailure: time.Unix(1700000060, 0).UTC(),
	}
	switch {
	case flags&4 != 0: // no origin
	case flags&2 != 0:
		dl.Origin = dedup.Origin{Topic: field(7), Partition: int32(attempts), Offset: attempts * 7, Group: field(8),
			Timestamp: time.Unix(attempts, 0)}
	default:
		dl.Origin = dedup.Origin{QueueURL: field(7), MessageID: field(8)}
	}
	var originals []dedup.Header
	if len(attrs) == 0 {
		return dl, nil
	}
	for i, chunk := range bytes.Split(attrs, []byte{0xff}) {
		if i == 14 {
			break
		}
		var ctl byte
		if len(chunk) > 0 {
			ctl, chunk = chunk[0], chunk[1:]
		}
		h := dedup.Header{Key: fmt.Sprintf("attr-%d", i), Value: chunk}
		switch {
		case ctl%11 == 0 && ctl != 0: // an earlier letter's metadata: replaced
			h.Key = dedup.MetadataPrefix + h.Key
		case ctl%13 == 0 && ctl != 0 && i > 0: // a name repeated, as Kafka headers may be
			h.Key = fmt.Sprintf("attr-%d", i-1)
		}
		switch ctl % 5 {
		case 1:
			h.Type, h.Value = "String", []byte(text(string(h.Value), sqsAllowed)) // SQS delivers only valid text
		case 2:
			h.Type, h.Value = "Number.int", []byte(text(string(h.Value), sqsAllowed))
		case 3:
			h.Type = "Binary"
		case 4:
			h.Type = "Binary.gz"
		}
		dl.Headers = append(dl.Headers, h)
		if !strings.HasPrefix(h.Key, dedup.MetadataPrefix) {
			originals = append(originals, h)
		}
	}
	return dl, originals
}

func offlineSink(t *testing.T, url string, max int) *sqsdedup.Sink {
	t.Helper()
	s, err := sqsdedup.NewSink(sqs.New(sqs.Options{Region: "us-east-1"}), url, sqsdedup.WithMaxMessageSize(max))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// unsendable says why SQS could not carry dl's originals or body, or "".
func unsendable(dl dedup.DeadLetter, originals []dedup.Header) string {
	names := map[string]bool{}
	for _, h := range originals {
		switch {
		case len(h.Value) == 0:
			return fmt.Sprintf("attribute %q is empty", h.Key)
		case names[h.Key]:
			return fmt.Sprintf("attribute %q appears twice", h.Key)
		}
		names[h.Key] = true
	}
	if len(names) >= 10 {
		return fmt.Sprintf("%d original attributes leave no room for the metadata", len(names))
	}
	if s := string(dl.Payload); text(s, sqsAllowed) != s {
		return "body is not text SQS can carry"
	}
	return ""
}

// checkRefusal fails t unless the sink was right to refuse dl with err.
func checkRefusal(t *testing.T, dl dedup.DeadLetter, originals []dedup.Header, dlq string, max int, err error) {
	t.Helper()
	var tooLarge *sqsdedup.TooLargeError
	switch {
	case errors.Is(err, sqsdedup.ErrTooManyAttributes):
		if !strings.Contains(unsendable(dl, originals), "no room") {
			t.Fatalf("ErrTooManyAttributes for %d originals", len(originals))
		}
	case errors.As(err, &tooLarge):
		if reason := unsendable(dl, originals); reason != "" {
			t.Fatalf("TooLargeError for a letter whose %s", reason)
		}
		unlimited, err := sqsdedup.SinkInput(offlineSink(t, dlq, 1<<30), dl)
		if err != nil {
			t.Fatalf("refused without a size limit: %v", err)
		}
		if size := inputSize(unlimited); tooLarge.Limit != max || tooLarge.Size != size || size <= max {
			t.Fatalf("TooLargeError{Size: %d, Limit: %d} for a letter of %d bytes under a limit of %d", tooLarge.Size, tooLarge.Limit, size, max)
		}
	default:
		if unsendable(dl, originals) == "" {
			t.Fatalf("refused a sendable letter: %v", err)
		}
	}
}

// inputSize is the size SQS counts for a message: body, and each
// attribute's name, data type and value.
func inputSize(in *sqs.SendMessageInput) int {
	n := len(aws.ToString(in.MessageBody))
	for name, v := range in.MessageAttributes {
		n += len(name) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue)) + len(v.BinaryValue)
	}
	return n
}

// checkOriginals fails t unless every original attribute is in the input,
// with its type and value: typed ones as they were, untyped ones (from
// another transport) as String when they are SQS text, else Binary.
func checkOriginals(t *testing.T, in *sqs.SendMessageInput, originals []dedup.Header) {
	t.Helper()
	for _, h := range originals {
		v, ok := in.MessageAttributes[h.Key]
		if !ok {
			t.Fatalf("original attribute %q dropped", h.Key)
		}
		typ := h.Type
		if typ == "" {
			typ = "String"
			if text(string(h.Value), sqsAllowed) != string(h.Value) {
				typ = "Binary"
			}
		}
		got := []byte(aws.ToString(v.StringValue))
		if strings.HasPrefix(typ, "Binary") {
			got = v.BinaryValue
		}
		if aws.ToString(v.DataType) != typ || !bytes.Equal(got, h.Value) {
			t.Fatalf("original attribute %q is %s %q, want %s %q", h.Key, aws.ToString(v.DataType), got, typ, h.Value)
		}
	}
}

// checkReadBack fails t unless DeadLetterMetadata reads every metadata field
// back from the input as SQS would deliver it: exactly when it is SQS text,
// else with each character SQS refuses replaced by U+FFFD (control
// characters survive in the packed JSON form, escaped).
func checkReadBack(t *testing.T, in *sqs.SendMessageInput, dl dedup.DeadLetter) {
	t.Helper()
	_, packed := in.MessageAttributes[sqsdedup.MetadataAttribute]
	for name, v := range in.MessageAttributes {
		if aws.ToString(v.DataType) == "String" && text(aws.ToString(v.StringValue), sqsAllowed) != aws.ToString(v.StringValue) {
			t.Fatalf("attribute %q is not text SQS accepts: %q", name, aws.ToString(v.StringValue))
		}
		if packed && name != sqsdedup.MetadataAttribute && strings.HasPrefix(name, dedup.MetadataPrefix) {
			t.Fatalf("metadata both packed and in attribute %q", name)
		}
	}
	got, err := sqsdedup.DeadLetterMetadata(types.Message{MessageAttributes: in.MessageAttributes})
	if err != nil {
		t.Fatal(err)
	}
	keep := sqsAllowed
	if packed {
		keep = func(r rune) bool { return r != 0xFFFE && r != 0xFFFF }
	}
	for _, h := range dl.Metadata() {
		if want := text(string(h.Value), keep); got[h.Key] != want {
			t.Fatalf("metadata %s read back as %q, want %q (packed: %v)", h.Key, got[h.Key], want, packed)
		}
	}
}

// sqsAllowed reports whether SQS accepts r in text: #x9 | #xA | #xD |
// #x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF.
func sqsAllowed(r rune) bool {
	return r == '\t' || r == '\n' || r == '\r' || r >= 0x20 && r <= 0xD7FF ||
		r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// text returns s with each invalid UTF-8 byte, and each rune keep refuses,
// replaced by U+FFFD.
func text(s string, keep func(rune) bool) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		if r == utf8.RuneError && size == 1 || !keep(r) {
			r = utf8.RuneError
		}
		b.WriteRune(r)
		s = s[size:]
	}
	return b.String()
}

func fifoID(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
