package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// DynamoDBServer is a private DynamoDB Local that a test may kill and start
// again without disturbing the shared one other tests use. Its tables live in
// a temporary directory (on tmpfs where there is one), not in the process's
// memory, so that they survive a restart as a real service's data would.
type DynamoDBServer struct {
	t    testing.TB
	jar  string
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// StartDynamoDBLocal starts a DynamoDB Local of its own on a free loopback
// port, from the jar scripts/services.sh caches under .cache/ (or
// DEDUP_DYNAMODB_JAR), and stops it when t ends.
func StartDynamoDBLocal(t testing.TB) *DynamoDBServer {
	t.Helper()
	jar, err := dynamoDBLocalJar()
	if err == nil {
		_, err = exec.LookPath("java")
	}
	if err != nil {
		Unavailable(t, "DynamoDB Local jar", err)
	}
	// DynamoDB Local syncs every write to its SQLite file: on a disk that
	// makes each write take tens of milliseconds, on tmpfs well under one.
	dir, err := os.MkdirTemp(memoryDir(), "dedup-ddb-")
	if err != nil {
		t.Fatal(err)
	}
	s := &DynamoDBServer{t: t, jar: jar, dir: dir, port: freePort(t)}
	t.Cleanup(func() {
		s.kill()
		os.RemoveAll(dir)
	})
	s.Start()
	return s
}

// Endpoint returns the server's URL.
func (s *DynamoDBServer) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.port) }

// Client returns a client of the server that does not retry, so that an
// outage shows at once.
func (s *DynamoDBServer) Client() *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		BaseEndpoint:                    aws.String(s.Endpoint()),
		Region:                          "us-east-1",
		Credentials:                     credentials.NewStaticCredentialsProvider("local", "local", ""),
		DisableValidateResponseChecksum: true,
		RetryMaxAttempts:                1,
	})
}

// Start starts the server and waits until it answers, for as long as it
// shows signs of life (awaitStart).
func (s *DynamoDBServer) Start() {
	s.t.Helper()
	logPath := filepath.Join(s.dir, "log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logFile.Close()
	// The client compiler only (TieredStopAtLevel=1) suits a test's short
	// run: DynamoDB Local answered in about 2.3 s instead of 5 to 7, and took
	// 4,000 writes at 640 to 890 a second instead of 250 to 520, at a load
	// average of 12 to 23 on two cores. The server compiler's work never
	// pays off in a run this short.
	s.cmd = DieWithTest(exec.Command("java", "-XX:TieredStopAtLevel=1",
		"-Djava.library.path="+filepath.Join(filepath.Dir(s.jar), "DynamoDBLocal_lib"),
		"-jar", s.jar, "-sharedDb", "-dbPath", s.dir, "-disableTelemetry", "-port", strconv.Itoa(s.port)))
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start private DynamoDB Local: %v", err)
	}
	done := make(chan struct{})
	s.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(s.cmd)

	client := s.Client()
	awaitStart(s.t, "private DynamoDB Local", s.cmd.Process.Pid, done, logPath, func(ctx context.Context) error {
		_, err := client.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)})
		return err
	})
}

// Kill kills the server with SIGKILL, as a crash would, and waits for it to
// exit.
func (s *DynamoDBServer) Kill() {
	s.t.Helper()
	if s.cmd == nil {
		s.t.Fatal("private DynamoDB Local is not running")
	}
	s.kill()
}

func (s *DynamoDBServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// dynamoDBLocalJar finds DynamoDBLocal.jar: DEDUP_DYNAMODB_JAR, else the copy
// scripts/services.sh unpacks under the module root's .cache/.
func dynamoDBLocalJar() (string, error) {
	if jar := os.Getenv("DEDUP_DYNAMODB_JAR"); jar != "" {
		return jar, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
	matches, _ := filepath.Glob(filepath.Join(dir, ".cache", "dynamodb-local-*", "package", "lib", "dynamodb_local_*", "DynamoDBLocal.jar"))
	if len(matches) == 0 {
		return "", fmt.Errorf("no DynamoDBLocal.jar under %s/.cache (run `make services`, or set DEDUP_DYNAMODB_JAR)", dir)
	}
	return matches[len(matches)-1], nil
}

// memoryDir returns a directory in memory (tmpfs) when the machine has one,
// else the default temporary directory.
func memoryDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		return "/dev/shm"
	}
	return ""
}
