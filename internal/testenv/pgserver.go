package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// PGServer is a private PostgreSQL server that a test may stop and start
// without disturbing the shared one other tests use.
type PGServer struct {
	t       testing.TB
	bin     string
	dir     string
	port    int
	asOwner []string // command prefix running as the data directory's owner
}

// StartPostgresServer initialises and starts a throwaway PostgreSQL cluster
// on a free loopback port, stopped and removed when t ends.
func StartPostgresServer(t testing.TB) *PGServer {
	t.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		Unavailable(t, "PostgreSQL server binaries", err)
	}
	dir, err := os.MkdirTemp("", "dedup-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s := &PGServer{t: t, bin: bin, dir: dir, port: freePort(t)}
	t.Cleanup(func() {
		s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "stop")
		os.RemoveAll(dir)
	})
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: run the cluster as postgres.
		s.asOwner = []string{"runuser", "-u", "postgres", "--"}
		if out, err := exec.Command("chown", "postgres", dir).CombinedOutput(); err != nil {
			Unavailable(t, "PostgreSQL server (chown)", fmt.Errorf("%v: %s", err, out))
		}
	}
	if out, err := s.run("initdb", "-D", s.data(), "-A", "trust", "-U", "postgres", "--no-sync"); err != nil {
		Unavailable(t, "PostgreSQL server (initdb)", fmt.Errorf("%v: %s", err, out))
	}
	s.Start()
	return s
}

func (s *PGServer) data() string { return filepath.Join(s.dir, "data") }

// DSN returns the server's connection string.
func (s *PGServer) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", s.port)
}

// Start starts the server and waits until it accepts connections. pg_ctl
// waits while the postmaster lives and stops waiting when it exits, so its
// bound is startLimit rather than its default 60 s, which a start after an
// immediate stop (crash recovery) may need on a busy machine.
func (s *PGServer) Start() {
	s.t.Helper()
	opts := "-p " + strconv.Itoa(s.port) + " -k " + s.dir +
		" -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
	if out, err := s.run("pg_ctl", "-D", s.data(), "-o", opts, "-l", filepath.Join(s.dir, "log"), "-w", "-t", pgCtlWait(), "start"); err != nil {
		s.t.Fatalf("start private PostgreSQL: %v: %s", err, out)
	}
}

// Stop stops the server at once, dropping every connection.
func (s *PGServer) Stop() {
	s.t.Helper()
	if out, err := s.run("pg_ctl", "-D", s.data(), "-m", "immediate", "-w", "-t", pgCtlWait(), "stop"); err != nil {
		s.t.Fatalf("stop private PostgreSQL: %v: %s", err, out)
	}
}

// pgCtlWait returns pg_ctl's -t: how many seconds it waits for a start or a stop.
func pgCtlWait() string { return strconv.Itoa(int(startLimit / time.Second)) }

// run runs one of the server's tools as the data directory's owner, for at
// most a little more than startLimit (initdb and pg_ctl on a busy machine).
func (s *PGServer) run(tool string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startLimit+time.Minute)
	defer cancel()
	argv := append(append(append([]string(nil), s.asOwner...), filepath.Join(s.bin, tool)), args...)
	return exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
}

func postgresBinDir() (string, error) {
	if dir := os.Getenv("DEDUP_POSTGRES_BIN"); dir != "" {
		return dir, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", fmt.Errorf("no initdb under /usr/lib/postgresql/*/bin (set DEDUP_POSTGRES_BIN)")
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ClosedPort returns a loopback address where nothing listens.
func ClosedPort(t testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(freePort(t))
}
