package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/user"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/dedupui"
	"github.com/dedupkit/dedup/outbox"
)

// uiShutdown bounds how long the console waits for its requests to end
// once interrupted.
const uiShutdown = 10 * time.Second

func runUI(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("ui")
	var sf storeFlags
	sf.register(fs, true)
	addr := fs.String("addr", "127.0.0.1:8080", "address to serve the console on; it has no authentication of its own: keep it on a loopback address or behind one")
	actions := fs.Bool("actions", false, "offer the actions: release and forget records, requeue failed outbox events")
	payloads := fs.Bool("payloads", false, "show the results stored with records")
	outboxTable := fs.String("outbox-table", outbox.DefaultTable, "the outbox table of the PostgreSQL database (shown when it exists; \"\" for none)")
	createIndexes := fs.Bool("create-indexes", false, "create the PostgreSQL indexes the console reads through if missing (CREATE INDEX CONCURRENTLY; every claim pays for them: see docs/operations.md)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	stores, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer closeStores(stores)
	if len(stores) != 1 {
		return fmt.Errorf("%w: name one store", errUsage)
	}
	st := stores[0]
	opts := []dedupui.Opt{dedupui.WithCaller(cliCaller)}
	if *actions {
		opts = append(opts, dedupui.WithActions())
	}
	if *payloads {
		opts = append(opts, dedupui.WithPayloads())
	}
	if pg, ok := st.store.(*dedup.PostgresStore); ok {
		if *createIndexes {
			if err := pg.CreateConsoleIndexes(ctx); err != nil {
				return err
			}
		}
		ob, err := consoleOutbox(ctx, st.pool, *outboxTable)
		if err != nil {
			return err
		}
		if ob != nil {
			opts = append(opts, dedupui.WithOutbox(ob, st.pool))
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	srv := &http.Server{Handler: dedupui.New(st.store, opts...), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(out, "dedup console of the %s store on http://%s/ (interrupt to stop)\n", st.name, ln.Addr())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), uiShutdown)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// consoleOutbox returns the outbox of table if the database has it, nil
// when it has not or table is "".
func consoleOutbox(ctx context.Context, pool *pgxpool.Pool, table string) (*outbox.Outbox, error) {
	if table == "" {
		return nil, nil
	}
	ob, err := outbox.New(outbox.WithTable(table))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if _, err := ob.Failed(ctx, pool, 0); errors.Is(err, outbox.ErrNotMigrated) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return ob, nil
}

// cliCaller names who acts through dedup ui: the local user it runs as,
// and the address the request came from.
func cliCaller(r *http.Request) string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	} else if n := os.Getenv("USER"); n != "" {
		name = n
	}
	return "dedup ui run by " + name + ", request from " + r.RemoteAddr
}
