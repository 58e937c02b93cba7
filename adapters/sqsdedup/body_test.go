package sqsdedup_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/adaptertest"
	"github.com/dedupkit/dedup/internal/testenv"
)

// An answer that comes before net/http has finished writing its request
// loses nothing. On a loaded machine the goroutine writing a request can be
// descheduled between the last byte of the body and its check that nothing
// is left, long enough for a local endpoint to answer: the SDK then has
// closed the body, and the check finds out. With the SDK's body as it is,
// the check fails, net/http closes the connection under the answer being
// read, the SDK receives again, and the messages of the first answer are
// hidden for a whole visibility timeout (the dedupbench sqs row stalled
// 30 s in about half its runs). lateWriteCheck gives every call that
// interleaving, so the test does not depend on the scheduler: each message
// must be handled on its first delivery, long before its visibility timeout
// could bring it back.
func TestAnswerBeforeRequestWrittenLosesNoReceive(t *testing.T) {
	t.Parallel()
	c := client(t)
	// Far longer than the wait below: a lost message cannot come back in time.
	url := testenv.SQSQueue(t, c, map[string]string{"VisibilityTimeout": "300"})
	const n = 20
	// An answer holding even one message is longer than what net/http reads
	// with the headers, so the rest is read from the connection.
	body := strings.Repeat("x", 6000)
	for i := range n {
		send(t, c, url, "answer-"+strconv.Itoa(i), body, nil)
	}
	var mu sync.Mutex
	receiveCounts := make(map[string]string)
	rec := adaptertest.NewEffects()
	w := wrap(t, dedup.NewMemoryStore(), url, rec, func(_ context.Context, m types.Message) error {
		mu.Lock()
		receiveCounts[eventID(m)] = m.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)]
		mu.Unlock()
		rec.Apply(eventID(m))
		return nil
	})
	late := &lateWriteCheck{}
	stop := start(t, late.client(c), url, w)
	adaptertest.WaitFor(t, 60*time.Second, "every message handled on its first delivery", func() bool {
		return rec.Outcomes(dedup.OutcomeProcessed) == n
	})
	stop()
	if late.held.Load() == 0 {
		t.Fatal("no request's write check waited for the answer: the test did not give calls the interleaving it is about")
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		id := "answer-" + strconv.Itoa(i)
		if got := receiveCounts[id]; got != "1" {
			t.Errorf("%s handled at ApproximateReceiveCount %q, want 1: a receive's answer was lost", id, got)
		}
		if got := rec.Count(id); got != 1 {
			t.Errorf("%s applied %d times, want 1", id, got)
		}
	}
	assertDrained(t, c, url)
}

// lateWriteCheck makes every call of an SQS client take one interleaving of
// net/http's writing goroutine with the caller's: the check after the last
// byte of the body that nothing is left runs only once the SDK has the
// answer's headers and has closed the body; and should that check fail, the
// connection is closed, as net/http then does, before the caller reads the
// answer's body.
type lateWriteCheck struct {
	held atomic.Int32 // checks that waited for the close
}

func (l *lateWriteCheck) client(c *sqs.Client) *sqs.Client {
	return sqs.New(c.Options(), func(o *sqs.Options) { o.HTTPClient = lateCheckDoer{next: o.HTTPClient, l: l} })
}

type lateCheckDoer struct {
	next sqs.HTTPClient
	l    *lateWriteCheck
}

func (d lateCheckDoer) Do(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 {
		return d.next.Do(req)
	}
	b := &heldBody{body: req.Body, left: req.ContentLength, closed: make(chan struct{}), done: req.Context().Done(), l: d.l}
	// On the caller's request itself: the SDK closes that body once Do
	// returns.
	if _, ok := req.Body.(io.WriterTo); ok {
		req.Body = writerToBody{b}
	} else {
		req.Body = b
	}
	var conn atomic.Pointer[net.Conn]
	wrote := make(chan error, 1)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn:      func(info httptrace.GotConnInfo) { conn.Store(&info.Conn) },
		WroteRequest: func(info httptrace.WroteRequestInfo) { wrote <- info.Err },
	}))

	resp, err := d.next.Do(req)

	if err != nil {
		return resp, err
	}
	resp.Body = &afterWrite{ReadCloser: resp.Body, wrote: wrote, conn: &conn}
	return resp, nil
}

// heldBody is a request body whose reads after the last byte wait until it
// is closed (or its request is cancelled).
type heldBody struct {
	body   io.ReadCloser
	left   int64 // bytes not yet read, by net/http's writing goroutine only
	closed chan struct{}
	once   sync.Once
	done   <-chan struct{}
	l      *lateWriteCheck
}

func (b *heldBody) hold() {
	if b.left > 0 {
		return
	}

	select {
	case <-b.closed:
		b.l.held.Add(1)
	case <-b.done:
	}
}

func (b *heldBody) Read(p []byte) (int, error) {
	b.hold()
	n, err := b.body.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *heldBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.body.Close()
}

// writerToBody is a heldBody over a body that has WriteTo, keeping it.
type writerToBody struct{ *heldBody }

func (b writerToBody) WriteTo(w io.Writer) (int64, error) {
	b.hold()
	n, err := b.body.(io.WriterTo).WriteTo(w)
	b.left -= n
	return n, err
}

// afterWrite is an answer's body read only once its request is written:
// if writing failed, its connection is closed first.
type afterWrite struct {
	io.ReadCloser
	wrote <-chan error
	conn  *atomic.Pointer[net.Conn]
	once  sync.Once
}

func (a *afterWrite) Read(p []byte) (int, error) {
	a.once.Do(func() {
		if err := <-a.wrote; err != nil {
			if c := a.conn.Load(); c != nil {
				(*c).Close()
			}
		}
	})
	return a.ReadCloser.Read(p)
}
