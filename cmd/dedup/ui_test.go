package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

// lockedBuffer is a bytes.Buffer the command writes to while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// dedup ui serves the console of the store its flags name: a stuck record
// shows on its page, the action is refused without -actions, and an
// interrupt stops it with status 0.
func TestUIServesTheStore(t *testing.T) {
	dsn, table, store, _ := postgresTable(t)
	ctx := context.Background()
	key := dedup.Key{Scope: "cli/ui", EventID: "stuck-1"}
	_, err := store.Claim(ctx, dedup.ClaimRequest{Key: key, Fingerprint: "f", Lease: time.Millisecond, TTL: time.Hour})
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{"ui", "-postgres", dsn, "-table", table, "-addr", "127.0.0.1:0", "-create-indexes", "-outbox-table", ""}, &out, &errOut)
	}()
	serving := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/)`)
	var base string
	deadline := time.Now().Add(60 * time.Second)
	for base == "" {
		select {
		case code := <-done:
			t.Fatalf("dedup ui ended with %d: %s%s", code, out.String(), errOut.String())
		default:
		}
		if m := serving.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
		} else if time.Now().After(deadline) {
			t.Fatal("dedup ui does not say where it serves")
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	page := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool {
		_, body := page("stuck")
		return strings.Contains(body, `data-scope="cli/ui" data-id="stuck-1"`)
	}, 60*time.Second, 20*time.Millisecond, "the stuck record on the stuck page")
	code, body := page("")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "lacks the console's indexes", "-create-indexes created them")
	code, _ = page("release?scope=cli%2Fui&id=stuck-1")
	require.Equal(t, http.StatusForbidden, code, "an action without -actions")
	stop()
	select {
	case code := <-done:
		require.Equal(t, 0, code, errOut.String())
	case <-time.After(60 * time.Second):
		t.Fatal("dedup ui does not stop when interrupted")
	}
}
