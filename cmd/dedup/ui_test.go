package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dedupkit/dedup"
)

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
	// The command's output comes through a pipe: its first line says where
	// it serves; what follows is drained until the command ends.
	pr, pw := io.Pipe()
	var errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		defer pw.Close()
		done <- run(runCtx, []string{"ui", "-postgres", dsn, "-table", table, "-addr", "127.0.0.1:0", "-create-indexes", "-outbox-table", ""}, pw, &errOut)
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		stop()
		t.Fatalf("dedup ui ended with %d before saying where it serves: %v %s", <-done, err, errOut.String())
	}
	drained := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, pr); close(drained) }()
	defer func() { stop(); <-drained }()
	m := regexp.MustCompile(`on (http://127\.0\.0\.1:\d+/)`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	base := m[1]
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
