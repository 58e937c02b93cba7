package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupkit/dedup"
)

// recordView is a record as the commands print it.
type recordView struct {
	Store        string    `json:"store,omitempty"`
	Scope        string    `json:"scope"`
	EventID      string    `json:"event_id"`
	Status       string    `json:"status"`
	Attempts     int       `json:"attempts"`
	Owner        string    `json:"owner"`
	LeaseUntil   time.Time `json:"lease_until"`
	UpdatedAt    time.Time `json:"updated_at"`
	ExpiresAt    time.Time `json:"expires_at"`
	LastError    string    `json:"last_error,omitempty"`
	FirstFailure time.Time `json:"first_failure,omitzero"`
	LastFailure  time.Time `json:"last_failure,omitzero"`
}

func viewOf(store string, r dedup.Record) recordView {
	return recordView{Store: store, Scope: r.Key.Scope, EventID: r.Key.EventID, Status: string(r.Status),
		Attempts: r.Attempts, Owner: r.Owner, LeaseUntil: r.LeaseUntil, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt,
		LastError: r.LastError, FirstFailure: r.FirstFailure, LastFailure: r.LastFailure}
}

// keyCommand is a command on one key: its flags are the stores' and the
// key's, and what the command registers on fs besides.
type keyCommand struct {
	fs     *flag.FlagSet
	stores storeFlags
	key    dedup.Key
}

func newKeyCommand(name string, withRedis bool) *keyCommand {
	c := &keyCommand{fs: newFlags(name)}
	c.stores.register(c.fs, withRedis)
	c.fs.StringVar(&c.key.Scope, "scope", "", "the key's scope (required)")
	c.fs.StringVar(&c.key.EventID, "id", "", "the key's event ID (required)")
	return c
}

// parse parses args and checks the key.
func (c *keyCommand) parse(args []string) error {
	if err := parse(c.fs, args, 0); err != nil {
		return err
	}
	if c.key.Scope == "" || c.key.EventID == "" {
		return fmt.Errorf("%w: -scope and -id are required", errUsage)
	}
	if err := c.key.Validate(); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	return nil
}

func runInspect(ctx context.Context, args []string, out io.Writer) error {
	c := newKeyCommand("inspect", true)
	asJSON := c.fs.Bool("json", false, "print JSON")
	if err := c.parse(args); err != nil {
		return err
	}
	key := c.key
	stores, err := c.stores.open(ctx)
	if err != nil {
		return err
	}
	defer closeStores(stores)
	var views []recordView
	found := false
	for _, s := range stores {
		rec, err := s.store.Get(ctx, key)
		switch {
		case errors.Is(err, dedup.ErrNotFound):
			views = append(views, recordView{Store: s.name, Scope: key.Scope, EventID: key.EventID, Status: "none"})
		case err != nil:
			return err
		default:
			found = true
			views = append(views, viewOf(s.name, rec))
		}
	}
	if *asJSON {
		if err := json.NewEncoder(out).Encode(views); err != nil {
			return err
		}
	} else {
		for _, v := range views {
			printRecord(out, v)
		}
	}
	if !found {
		return fmt.Errorf("no record of %s in any store given", key)
	}
	return nil
}

func printRecord(out io.Writer, v recordView) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\t%s/%s\n", v.Store, v.Scope, v.EventID)
	fmt.Fprintf(tw, "  status\t%s\n", v.Status)
	if v.Status != "none" {
		fmt.Fprintf(tw, "  attempts\t%d\n", v.Attempts)
		fmt.Fprintf(tw, "  owner\t%s\n", v.Owner)
		fmt.Fprintf(tw, "  lease until\t%s\n", stamp(v.LeaseUntil))
		fmt.Fprintf(tw, "  updated\t%s\n", stamp(v.UpdatedAt))
		fmt.Fprintf(tw, "  expires\t%s\n", stamp(v.ExpiresAt))
		if v.LastError != "" {
			fmt.Fprintf(tw, "  last error\t%s\n", v.LastError)
			fmt.Fprintf(tw, "  failures\t%s .. %s\n", stamp(v.FirstFailure), stamp(v.LastFailure))
		}
	}
	tw.Flush()
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func runStuck(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("stuck")
	var sf storeFlags
	sf.register(fs, false)
	scope := fs.String("scope", "", "only this scope (default every scope)")
	olderThan := fs.Duration("older-than", 10*time.Minute, "a retryable failure counts as stuck when last updated longer ago than this")
	limit := fs.Int("limit", 100, "records to list at most")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *limit < 1 || *olderThan < 0 {
		return fmt.Errorf("%w: -limit must be positive and -older-than not negative", errUsage)
	}
	_, admin, closeStore, err := sf.openAdmin(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	recs, err := admin.Stuck(ctx, *scope, *olderThan, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		views := make([]recordView, 0, len(recs))
		for _, r := range recs {
			views = append(views, viewOf("", r))
		}
		return json.NewEncoder(out).Encode(views)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tATTEMPTS\tUPDATED\tLEASE UNTIL\tKEY\tLAST ERROR")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", r.Status, r.Attempts, stamp(r.UpdatedAt), stamp(r.LeaseUntil), r.Key, r.LastError)
	}
	tw.Flush()
	fmt.Fprintf(out, "%d stuck\n", len(recs))
	return nil
}

func runRelease(ctx context.Context, args []string, out io.Writer) error {
	c := newKeyCommand("release", false)
	force := c.fs.Bool("force", false, "release a key whose lease is still running (its worker may be alive)")
	yes := c.fs.Bool("yes", false, "do it (default: say what would be done)")
	if err := c.parse(args); err != nil {
		return err
	}
	key := c.key
	store, admin, closeStore, err := c.stores.openAdmin(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	rec, err := store.Get(ctx, key)
	if errors.Is(err, dedup.ErrNotFound) {
		fmt.Fprintf(out, "%s has no record: it is claimable already\n", key)
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case rec.Status == dedup.StatusSucceeded:
		return fmt.Errorf("%s succeeded: releasing it would run its effect again; nothing done", key)
	case rec.Status == dedup.StatusProcessing && rec.LeaseUntil.After(time.Now()) && !*force:
		return fmt.Errorf("%s is held by a worker whose lease runs until %s; it may be alive: wait, or use -force", key, stamp(rec.LeaseUntil))
	}
	if !*yes {
		fmt.Fprintf(out, "would release %s (%s, %d attempts): its record is deleted and the event runs afresh when delivered again; run with -yes\n",
			key, rec.Status, rec.Attempts)
		return nil
	}
	done, err := admin.Forget(ctx, key, rec.Owner)
	if err != nil {
		return err
	}
	if !done {
		return fmt.Errorf("%s changed since it was read (claimed again or settled); nothing done", key)
	}
	fmt.Fprintf(out, "released %s (was %s, %d attempts)\n", key, rec.Status, rec.Attempts)
	return nil
}

func runPurge(ctx context.Context, args []string, out io.Writer) error {
	fs := newFlags("purge")
	var sf storeFlags
	sf.register(fs, false)
	yes := fs.Bool("yes", false, "do it (default: count what would be deleted)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	stores, err := sf.open(ctx)
	if err != nil {
		return err
	}
	defer closeStores(stores)
	for _, s := range stores {
		purger, ok := s.store.(interface {
			Purge(context.Context) (int, error)
		})
		if !ok {
			return fmt.Errorf("%w: the %s store expires its records by itself", errUsage, s.name)
		}
		if !*yes {
			if s.pool != nil {
				var n int64
				if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier(strings.Split(sf.table, ".")).Sanitize()+` WHERE expires_at <= now()`).Scan(&n); err != nil {
					return fmt.Errorf("count expired records: %w", err)
				}
				fmt.Fprintf(out, "%s: would delete %d expired records; run with -yes\n", s.name, n)
			} else {
				fmt.Fprintf(out, "%s: would scan the table and delete its expired items (its TTL deletes them anyway); run with -yes\n", s.name)
			}
			continue
		}
		n, err := purger.Purge(ctx)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s: deleted %d expired records\n", s.name, n)
	}
	return nil
}
