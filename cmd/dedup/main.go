// Command dedup inspects and repairs what dedup keeps: the records of the
// stores, the outbox, and the dead letters, which it sends back to where
// they came from once the bug that parked them is fixed.
//
//	go install github.com/dedupkit/dedup/cmd/dedup@latest
//
//	dedup inspect -scope orders/charge -id order-42 [-json]
//	dedup stuck [-scope orders/charge] [-older-than 10m] [-limit 100] [-json]
//	dedup release -scope orders/charge -id order-42 [-force] [-yes]
//	dedup purge [-yes]
//	dedup migrate [-table dedup_records] [-yes]
//	dedup outbox status [-limit 20] [-json]
//	dedup outbox requeue [-id ID ...] [-all] [-limit 20] [-yes]
//	dedup redrive kafka -brokers host:9092 -dlq orders.dlq [-reason handler-error] [-min-age 1h] [-rate 100] [-yes]
//	dedup redrive sqs -dlq-url https://... [-reason ...] [-min-age ...] [-rate ...] [-yes]
//	dedup redrive kinesis -dlq-url https://... [-kinesis URL] [-stream S] [-reason ...] [-min-age ...] [-rate ...] [-yes]
//	dedup redrive amqp -amqp amqp://... -dlq orders.dlq [-reason ...] [-min-age ...] [-rate ...] [-yes]
//	dedup redrive nats -nats nats://... -dlq DLQ [-subject dlq.orders] [-reason ...] [-min-age ...] [-rate ...] [-yes]
//	dedup redrive pubsub -project P -subscription orders-dlq-sub [-endpoint host:port] [-reason ...] [-min-age ...] [-rate ...] [-yes]
//	dedup redrive redis -redis 127.0.0.1:6379 -dlq orders:dlq [-reason ...] [-min-age ...] [-rate ...] [-yes]
//	dedup ui [-addr 127.0.0.1:8080] [-actions] [-payloads] [-outbox-table outbox] [-create-indexes]
//
// The stores are named by flags or by the environment variables the tests
// use: -postgres (DEDUP_POSTGRES_DSN), -dynamodb (DEDUP_DYNAMODB_ENDPOINT,
// or -dynamodb aws for the account's own), -redis (DEDUP_REDIS_ADDR), and
// -table. A command that changes something does nothing without -yes but
// say what it would do. The exit status is 0 on success, 1 when the command
// failed and 2 when it was used wrongly.
//
// With -json, inspect and stuck print their records as a JSON array, and
// outbox status prints one JSON object: the events counted by state
// (pending, failed, sent), oldest_pending_seconds (the age of the oldest
// pending event, 0 when none is), and failed_events, the failed events
// oldest first (up to -limit), each with event_id, destination, key (base64,
// null when the event has none), attempts, last_error, created_at and due_at.
//
// outbox requeue requeues only failed events: it names the requested IDs
// that are not failed (unknown, pending or sent) and leaves them as they are,
// in the dry run as with -yes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// errUsage marks a command used wrongly: exit status 2.
var errUsage = errors.New("usage")

// command is one subcommand: it parses its flags from args and writes its
// output to out.
type command struct {
	name, usage string
	run         func(ctx context.Context, args []string, out io.Writer) error
}

var commands = []command{
	{"inspect", "show one key's record in every store given", runInspect},
	{"stuck", "list records held without progress", runStuck},
	{"release", "make a stuck or failed key claimable again", runRelease},
	{"purge", "delete expired records", runPurge},
	{"migrate", "print the PostgreSQL table's migration to record v2; -yes to migrate", runMigrate},
	{"outbox", "status of the outbox, requeue failed events", runOutbox},
	{"redrive", "send dead letters back to their origin (kafka, sqs, kinesis, amqp, nats, pubsub, redis)", runRedrive},
	{"ui", "serve the operator's console (dedupui) over the store's flags", runUI},
}

// run runs the command line args and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stderr)
		return 2
	case isHelp(args[0]):
		usage(stderr)
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0 // asked for: as the flag package exits
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "dedup %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(stderr, "dedup %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "dedup: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// help writes a command's synopsis and its subcommands, given as name and
// description pairs, and returns flag.ErrHelp.
func help(w io.Writer, synopsis string, subcommands ...string) error {
	fmt.Fprintln(w, "usage: "+synopsis)
	for i := 0; i+1 < len(subcommands); i += 2 {
		fmt.Fprintf(w, "  %-8s %s\n", subcommands[i], subcommands[i+1])
	}
	fmt.Fprintln(w, "each takes -h for its flags")
	return flag.ErrHelp
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: dedup <command> [flags]; dedup <command> -h for its flags")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.usage)
	}
}

// newFlags returns a flag set for command name whose errors are returned,
// not printed and exited on; its usage goes to stderr.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("dedup "+name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	return fs
}

// parse parses args with fs, refusing positional arguments beyond want.
func parse(fs *flag.FlagSet, args []string, want int) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fs.NArg() > want {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(want))
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
