// Package pubsubenv connects a Google Cloud Pub/Sub client to a server
// reached without TLS nor credentials (an emulator, or pstest, the client
// library's in-process server), and holds what the tests on pstest share:
// a server with a client, and a check that no goroutine outlives them.
// It is a package of its own so that only what uses Pub/Sub imports the
// client library (whose import starts a goroutine of opencensus's).
package pubsubenv

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"go.uber.org/goleak"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Dial returns a client of project on the server at addr (host:port),
// reached over plain gRPC, and a function closing it and its connection.
func Dial(ctx context.Context, addr, project string) (*pubsub.Client, func(), error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("cannot reach Pub/Sub at %s: %w", addr, err)
	}
	c, err := pubsub.NewClient(ctx, project, option.WithGRPCConn(conn))
	if err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("cannot reach Pub/Sub at %s: %w", addr, err)
	}
	return c, func() { _ = c.Close(); _ = conn.Close() }, nil
}

// Client returns a client of project on the server at addr, closed when t
// ends.
func Client(t testing.TB, addr, project string) *pubsub.Client {
	t.Helper()
	c, closeClient, err := Dial(context.Background(), addr, project)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeClient)
	return c
}

// Start starts a pstest server, closed when t ends, and returns it with a
// client of project on it.
func Start(t testing.TB, project string, opts ...pstest.ServerReactorOption) (*pstest.Server, *pubsub.Client) {
	t.Helper()
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { _ = srv.Close() })
	return srv, Client(t, srv.Addr, project)
}

// leakWait bounds the wait for goroutines to end after the tests: a
// Receive's stream monitor returns on its next tick (every 10 s) after
// Receive has.
const leakWait = 30 * time.Second

// RunTests runs m's tests and exits, failing the run if a goroutine
// outlives them by more than leakWait, but for the one opencensus starts
// when the client library is imported, which lives as long as the process.
func RunTests(m *testing.M) {
	code := m.Run()
	if code == 0 {
		end := time.Now().Add(leakWait)
		for {
			err := goleak.Find(goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"))
			if err == nil {
				break
			}
			if time.Now().After(end) {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	os.Exit(code)
}
