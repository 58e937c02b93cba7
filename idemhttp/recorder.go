package idemhttp

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
)

// recorder buffers a handler's response so that it is stored before the
// client sees it. Past limit bytes of body, a recorder that may stream
// writes what it holds and passes the rest through (the response will not
// be stored); one that may not (transactional mode) drops the rest and
// reports an overflow.
type recorder struct {
	w       http.ResponseWriter
	header  http.Header
	status  int
	wrote   bool // WriteHeader or Write was called
	body    bytes.Buffer
	limit   int
	stream  bool
	passing bool // streaming through to w
	over    bool // the body outgrew limit
}

// newRecorder returns a recorder of w's answer, from pool when it holds one.
func newRecorder(pool *sync.Pool, w http.ResponseWriter, limit int, stream bool) *recorder {
	r, _ := pool.Get().(*recorder)
	if r == nil {
		r = &recorder{header: make(http.Header)}
	}
	r.w, r.status, r.limit, r.stream = w, http.StatusOK, limit, stream
	return r
}

// maxPooledBody is the largest body buffer a recorder keeps for the next
// request: a larger one goes with it, so that one large answer does not pin
// its buffer.
const maxPooledBody = 64 << 10

// release puts r back in pool for another request once its answer is sent
// and nothing reads it any more. The header values it recorded belong to
// the connection's writer now; only the map is kept, emptied.
func (r *recorder) release(pool *sync.Pool) {
	if r.body.Cap() > maxPooledBody {
		return
	}
	clear(r.header)
	r.body.Reset()
	r.w, r.wrote, r.passing, r.over = nil, false, false, false
	pool.Put(r)
}

func (r *recorder) Header() http.Header {
	if r.passing {
		return r.w.Header()
	}
	return r.header
}

func (r *recorder) WriteHeader(code int) {
	if r.wrote || code < 200 { // informational answers are not recorded
		return
	}
	r.wrote, r.status = true, code
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	if r.passing {
		return r.w.Write(p)
	}
	if r.body.Len()+len(p) <= r.limit {
		return r.body.Write(p)
	}
	r.over = true
	if !r.stream {
		return len(p), nil // discarded: the answer will be an error
	}
	r.passing = true
	r.flushHeader(false)
	if _, err := r.w.Write(r.body.Bytes()); err != nil {
		return 0, err
	}
	return r.w.Write(p)
}

// WriteString is Write for a string, without copying one that is buffered
// into bytes first: handlers writing through io.WriteString (fmt.Fprint,
// templates) cost no allocation here.
func (r *recorder) WriteString(s string) (int, error) {
	if r.passing || r.body.Len()+len(s) > r.limit {
		return r.Write([]byte(s))
	}
	r.WriteHeader(http.StatusOK)
	return r.body.WriteString(s)
}

// Unwrap returns the connection's writer, so that http.ResponseController
// reaches it: read and write deadlines and full duplex apply to the
// connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// FlushError sends a response streaming past the snapshot limit on to the
// client. A response held to be stored is sent once stored, so flushing it
// does nothing.
func (r *recorder) FlushError() error {
	if !r.passing {
		return nil
	}
	return http.NewResponseController(r.w).Flush()
}

// Flush is FlushError for handlers that look for an http.Flusher.
func (r *recorder) Flush() { _ = r.FlushError() }

// Hijack refuses: a hijacked connection's answer cannot be stored.
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("idemhttp: a response held to be stored cannot be hijacked: %w", http.ErrNotSupported)
}

// flushHeader sends the recorded status and headers to w.
func (r *recorder) flushHeader(withLength bool) {
	h := r.w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	// net/http counts a body it holds whole when the handler returns, as
	// a bare handler's answer is counted; a longer one is told its length
	// rather than sent in chunks.
	if withLength && bodyAllowed(r.status) && r.body.Len() > countedByServer {
		h["Content-Length"] = []string{strconv.Itoa(r.body.Len())}
	}
	r.w.WriteHeader(r.status)
}

// countedByServer is the longest body net/http sends with a Content-Length
// of its own counting when the handler sets none (its buffer before
// chunking).
const countedByServer = 2048

// flush sends the recorded response to w, unless it already streamed.
func (r *recorder) flush() {
	if r.passing {
		return
	}
	r.flushHeader(true)
	_, _ = r.w.Write(r.body.Bytes())
}

// bodyAllowed reports whether a response with status may carry a body.
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}
