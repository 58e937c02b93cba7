package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultRedisAddr is the Redis tests use when DEDUP_REDIS_ADDR is unset.
const DefaultRedisAddr = "127.0.0.1:6379"

// Redis returns a client of the shared Redis at DEDUP_REDIS_ADDR (host:port,
// or a redis:// URL naming a database), closed when t ends, or reports Redis
// unavailable.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	addr := Env("DEDUP_REDIS_ADDR", DefaultRedisAddr)
	opts := &redis.Options{Addr: addr}
	if strings.Contains(addr, "://") {
		var err error
		if opts, err = redis.ParseURL(addr); err != nil {
			t.Fatalf("DEDUP_REDIS_ADDR: %v", err)
		}
	}
	opts.DialTimeout = 2 * time.Second
	client := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		Unavailable(t, "Redis", err)
		return nil
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// RedisServer is a private redis-server that a test may kill, restart and
// reconfigure without disturbing the shared one other tests use.
type RedisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartRedisServer starts a redis-server on a free loopback port in a
// temporary directory, killed and removed when t ends. Without args it keeps
// nothing on disk (no RDB snapshots, no AOF); args are more redis-server
// options, such as "--appendonly", "yes".
func StartRedisServer(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin := Env("DEDUP_REDIS_SERVER", "redis-server")
	path, err := exec.LookPath(bin)
	if err != nil {
		Unavailable(t, "redis-server", err)
	}
	s := &RedisServer{t: t, bin: path, dir: t.TempDir(), port: freePort(t), args: args}
	t.Cleanup(func() {
		if s.cmd != nil {
			s.Kill()
		}
	})
	s.Start()
	return s
}

// Addr returns the server's host:port.
func (s *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a new client of the server, closed when the test ends.
func (s *RedisServer) Client(opts ...func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr(), DialTimeout: time.Second}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	s.t.Cleanup(func() { c.Close() })
	return c
}

// Start starts the server, with its data directory as it was, and waits
// until it answers, for as long as it shows signs of life (awaitStart).
func (s *RedisServer) Start() {
	s.t.Helper()
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "redis.log",
	}, s.args...)
	s.cmd = DieWithTest(exec.Command(s.bin, args...))
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	done := make(chan struct{})
	s.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(s.cmd)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	awaitStart(s.t, "redis-server on "+s.Addr(), s.cmd.Process.Pid, done, filepath.Join(s.dir, "redis.log"),
		func(ctx context.Context) error { return c.Ping(ctx).Err() })
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit. Nothing is flushed: what was not on disk is lost.
func (s *RedisServer) Kill() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("redis-server is not running")
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// String describes the server, for messages.
func (s *RedisServer) String() string {
	return fmt.Sprintf("redis-server %s %v", s.Addr(), s.args)
}

// StartRedisCluster starts a Redis Cluster of masters private servers, each
// with replicas replicas, on free loopback ports, the slots spread over the
// masters, and returns its servers, masters first, once the cluster is ok
// and every replica is in sync. args are more redis-server options for
// every node; a node fails over after --cluster-node-timeout, 5000 ms
// unless args say otherwise.
func StartRedisCluster(t testing.TB, masters, replicas int, args ...string) []*RedisServer {
	t.Helper()
	cli, err := exec.LookPath(Env("DEDUP_REDIS_CLI", "redis-cli"))
	if err != nil {
		Unavailable(t, "redis-cli", err)
	}
	nodeArgs := append([]string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "5000"}, args...)
	servers := make([]*RedisServer, masters*(1+replicas))
	addrs := make([]string, len(servers))
	for i := range servers {
		servers[i] = StartRedisServer(t, nodeArgs...)
		addrs[i] = servers[i].Addr()
	}
	// redis-cli makes masters of the first addresses it is given.
	create := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, create...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	for i, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		ok := false
		for ctx.Err() == nil {
			info := c.ClusterInfo(ctx).Val()
			ok = strings.Contains(info, "cluster_state:ok")
			if ok && i >= masters {
				ok = strings.Contains(c.Info(ctx, "replication").Val(), "master_link_status:up")
			}
			if ok {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
		if !ok {
			t.Fatalf("Redis Cluster node %s never reached cluster_state:ok (and, for a replica, its master's data)", addr)
		}
	}
	return servers
}
