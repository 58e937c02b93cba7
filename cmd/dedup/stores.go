package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/internal/pgident"
	"github.com/dedupkit/dedup/internal/sqsbody"
	"github.com/dedupkit/dedup/redisstore"
)

// storeFlags name the stores a command works on.
type storeFlags struct {
	postgres, dynamodb, redis, table string
	fs                               *flag.FlagSet // where they were registered
}

func (s *storeFlags) register(fs *flag.FlagSet, withRedis bool) {
	s.fs = fs
	fs.StringVar(&s.postgres, "postgres", env("DEDUP_POSTGRES_DSN", ""), "PostgreSQL DSN of the store (DEDUP_POSTGRES_DSN, unless another store is named on the command line)")
	fs.StringVar(&s.dynamodb, "dynamodb", env("DEDUP_DYNAMODB_ENDPOINT", ""), "DynamoDB endpoint URL of the store, or aws (DEDUP_DYNAMODB_ENDPOINT, unless another store is named on the command line)")
	if withRedis {
		fs.StringVar(&s.redis, "redis", env("DEDUP_REDIS_ADDR", ""), "Redis address of the store (DEDUP_REDIS_ADDR, unless another store is named on the command line)")
	}
	fs.StringVar(&s.table, "table", dedup.DefaultTable, "table of the PostgreSQL or DynamoDB store")
}

// named keeps only the stores the command line names, when it names one:
// `-dynamodb URL` works on DynamoDB alone, whatever DEDUP_POSTGRES_DSN says.
// With none named, the environment's stores stand.
func (s *storeFlags) named() {
	set := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["postgres"] && !set["dynamodb"] && !set["redis"] {
		return
	}
	for name, v := range map[string]*string{"postgres": &s.postgres, "dynamodb": &s.dynamodb, "redis": &s.redis} {
		if !set[name] {
			*v = ""
		}
	}
}

// namedStore is an open store and what closes it.
type namedStore struct {
	name  string
	store dedup.Store
	pool  *pgxpool.Pool // the PostgreSQL store's, else nil
	close func()
}

// open connects to every store named, checking that each answers.
func (s *storeFlags) open(ctx context.Context) ([]namedStore, error) {
	s.named()
	var out []namedStore
	fail := func(err error) ([]namedStore, error) {
		for _, o := range out {
			o.close()
		}
		return nil, err
	}
	if s.postgres != "" {
		pool, err := pgxpool.New(ctx, s.postgres)
		if err != nil {
			return fail(fmt.Errorf("PostgreSQL DSN: %w", err))
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return fail(fmt.Errorf("cannot reach PostgreSQL at %s: %w", redactDSN(s.postgres), err))
		}
		store, err := dedup.NewPostgresStore(pool, dedup.WithTable(s.table))
		if err == nil {
			err = findTable(ctx, pool, s.table)
		}
		if err != nil {
			pool.Close()
			return fail(err)
		}
		out = append(out, namedStore{name: "postgres", store: store, pool: pool, close: pool.Close})
	}
	if s.dynamodb != "" {
		cfg, err := awsConfig(ctx, s.dynamodb)
		if err != nil {
			return fail(err)
		}
		store, err := dedup.NewDynamoDBStore(dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
			if s.dynamodb != "aws" {
				o.BaseEndpoint = aws.String(s.dynamodb)
			}
		}), dedup.WithTable(s.table))
		if err != nil {
			return fail(err)
		}
		out = append(out, namedStore{name: "dynamodb", store: store, close: func() {}})
	}
	if s.redis != "" {
		opts := &redis.Options{Addr: s.redis}
		if u, err := url.Parse(s.redis); err == nil && (u.Scheme == "redis" || u.Scheme == "rediss") {
			if opts, err = redis.ParseURL(s.redis); err != nil {
				return fail(fmt.Errorf("redis URL: %w", err))
			}
		}
		client := redis.NewClient(opts)
		if err := client.Ping(ctx).Err(); err != nil {
			client.Close()
			return fail(fmt.Errorf("cannot reach Redis at %s: %w", opts.Addr, err))
		}
		store, err := redisstore.New(client)
		if err != nil {
			client.Close()
			return fail(err)
		}
		out = append(out, namedStore{name: "redis", store: store, close: func() { client.Close() }})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no store given: -postgres, -dynamodb or -redis (or DEDUP_POSTGRES_DSN, DEDUP_DYNAMODB_ENDPOINT, DEDUP_REDIS_ADDR)", errUsage)
	}
	return out, nil
}

// openAdmin opens the one store a repairing command works on.
func (s *storeFlags) openAdmin(ctx context.Context) (dedup.Store, dedup.Admin, func(), error) {
	stores, err := s.open(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	closeAll := func() { closeStores(stores) }
	if len(stores) != 1 {
		closeAll()
		return nil, nil, nil, fmt.Errorf("%w: name one store", errUsage)
	}
	admin, ok := stores[0].store.(dedup.Admin)
	if !ok {
		closeAll()
		return nil, nil, nil, fmt.Errorf("%w: the %s store cannot be repaired from here; use -postgres or -dynamodb", errUsage, stores[0].name)
	}
	return stores[0].store, admin, closeAll, nil
}

// closeStores closes what open opened.
func closeStores(stores []namedStore) {
	for _, s := range stores {
		s.close()
	}
}

// awsConfig loads the AWS configuration for endpoint: the account's own
// for "aws", else the endpoint of an emulator, which takes any credentials.
func awsConfig(ctx context.Context, endpoint string) (aws.Config, error) {
	cfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		return aws.Config{}, fmt.Errorf("AWS configuration: %w", err)
	}
	if endpoint == "aws" {
		return cfg, nil
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		cfg.Credentials = credentials.NewStaticCredentialsProvider("local", "local", "")
	}
	return cfg, nil
}

// sqsClient returns a client of the SQS endpoint ("aws" for the account's).
func sqsClient(ctx context.Context, endpoint string) (*sqs.Client, error) {
	cfg, err := awsConfig(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	return sqs.NewFromConfig(cfg, sqsbody.KeepConnection, func(o *sqs.Options) {
		if endpoint != "aws" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}

// redactDSN hides a DSN's password.
func redactDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		return u.String()
	}
	return "the DSN given"
}

// findTable returns nil when PostgreSQL finds table (as -table names it,
// valid) for the connection's user, else an error saying where it looked
// (the schemas the search_path gives) and in which schemas a table of that
// name exists, with what to change: a table made by Migrate under another
// search_path is there, only not where this connection looks.
func findTable(ctx context.Context, pool *pgxpool.Pool, table string) error {
	ident, _ := pgident.Parse(table)
	var found bool
	var user string
	var searched []string
	err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, current_user, current_schemas(false)`,
		ident.Sanitize()).Scan(&found, &user, &searched)
	if err != nil || found {
		return err
	}
	name := ident[len(ident)-1]
	rows, _ := pool.Query(ctx, `SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relname = $1 AND c.relkind IN ('r', 'p') ORDER BY 1`, name)
	elsewhere, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("look for table %s in other schemas: %w", name, err)
	}
	where := fmt.Sprintf("in the schemas the search_path gives user %s (%s)", user, strings.Join(searched, ", "))
	if len(ident) == 2 {
		where = "in schema " + ident[0]
	}
	if len(elsewhere) == 0 {
		return fmt.Errorf("table %s does not exist %s nor in any other schema: create it with dedup migrate -table %s -yes (PostgresStore.Migrate)",
			table, where, table)
	}
	return fmt.Errorf("table %s does not exist %s, but a table %s exists in schema %s: name it with -table %s.%s, or set search_path=%s in the DSN",
		table, where, name, strings.Join(elsewhere, ", "), elsewhere[0], name, elsewhere[0])
}
