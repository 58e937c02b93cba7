package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultRabbitMQURL and DefaultNATSURL are the brokers tests use when
// DEDUP_RABBITMQ_URL or DEDUP_NATS_URL is unset: the machine's own servers
// (scripts/brokers.sh).
const (
	DefaultRabbitMQURL = "amqp://guest:guest@127.0.0.1:5672/"
	DefaultNATSURL     = "nats://127.0.0.1:4222"
)

// RabbitMQURL returns the URL of the RabbitMQ at DEDUP_RABBITMQ_URL, once a
// connection to it succeeded, or reports RabbitMQ unavailable.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	url := Env("DEDUP_RABBITMQ_URL", DefaultRabbitMQURL)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		Unavailable(t, "RabbitMQ", err)
		return ""
	}
	conn.Close()
	return url
}

// RabbitMQ returns a connection to the RabbitMQ at DEDUP_RABBITMQ_URL,
// closed when t ends, or reports RabbitMQ unavailable.
func RabbitMQ(t testing.TB) *amqp.Connection {
	t.Helper()
	url := RabbitMQURL(t)
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("RabbitMQ at %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// NATSURL returns the URL of the NATS server at DEDUP_NATS_URL, once it
// answered with JetStream enabled, or reports NATS unavailable.
func NATSURL(t testing.TB) string {
	t.Helper()
	url := Env("DEDUP_NATS_URL", DefaultNATSURL)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second), nats.MaxReconnects(0))
	if err != nil {
		Unavailable(t, "NATS", err)
		return ""
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
	}
	if err != nil {
		Unavailable(t, "NATS JetStream", err)
		return ""
	}
	return url
}

// NATS returns a connection to the NATS server at DEDUP_NATS_URL, closed
// when t ends, and its JetStream context, or reports NATS unavailable.
func NATS(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := NATSURL(t)
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("NATS JetStream: %v", err)
	}
	return nc, js
}

// NATSServer is a private nats-server with JetStream that a test may kill,
// restart and configure (a small max_payload) without disturbing the
// shared one other tests use.
type NATSServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	conf string
	cmd  *exec.Cmd
	done <-chan struct{} // closed once cmd has exited
}

// StartNATSServer starts a nats-server with JetStream (its store in a
// temporary directory) on a free loopback port, killed when t ends; conf is
// more configuration, such as "max_payload: 4096".
func StartNATSServer(t testing.TB, conf string) *NATSServer {
	t.Helper()
	path, err := exec.LookPath(Env("DEDUP_NATS_SERVER", "nats-server"))
	if err != nil {
		if path, err = exec.LookPath("/usr/sbin/nats-server"); err != nil {
			Unavailable(t, "nats-server", err)
			return nil
		}
	}
	s := &NATSServer{t: t, bin: path, dir: t.TempDir(), port: freePort(t)}
	s.conf = fmt.Sprintf("listen: 127.0.0.1:%d\njetstream {\n  store_dir: %q\n}\n%s\n", s.port, filepath.Join(s.dir, "js"), conf)
	if err := os.WriteFile(filepath.Join(s.dir, "nats.conf"), []byte(s.conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.cmd != nil {
			s.Kill()
		}
	})
	s.Start()
	return s
}

// URL returns the server's nats:// URL.
func (s *NATSServer) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server, with its JetStream store as it was, and waits
// until it answers with JetStream enabled.
func (s *NATSServer) Start() {
	s.t.Helper()
	s.cmd = DieWithTest(exec.Command(s.bin, "-c", filepath.Join(s.dir, "nats.conf"), "-l", filepath.Join(s.dir, "nats.log")))
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start nats-server: %v", err)
	}
	done := make(chan struct{})
	s.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(s.cmd)
	awaitStart(s.t, "nats-server on "+s.URL(), s.cmd.Process.Pid, done, filepath.Join(s.dir, "nats.log"),
		func(context.Context) error { return s.answers() })
}

// answers returns nil once the server's JetStream answers.
func (s *NATSServer) answers() error {
	nc, err := nats.Connect(s.URL(), nats.Timeout(time.Second), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = js.AccountInfo(ctx)
	return err
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it
// to exit.
func (s *NATSServer) Kill() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("nats-server is not running")
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}
