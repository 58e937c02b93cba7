// Package crashtest runs the worker processes of a crash campaign: the test
// binary executed again in worker mode, one process per slot, killed with
// SIGKILL as a crash would and started again, each writing its own log.
// The campaigns under reliability/ share it.
package crashtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dedupkit/dedup/deduptype"
	"github.com/dedupkit/dedup/internal/testenv"
)

// readyLine is what a worker writes to its log once SIGTERM stops it
// gracefully; before, SIGTERM kills it.
const readyLine = "worker: ready"

// ExitRunError is a worker's exit code when its consumer's Run returned an
// error.
const ExitRunError = 3

// Soak reports whether the long version of the campaigns runs
// (DEDUP_SOAK=1).
func Soak() bool { return testenv.Env("DEDUP_SOAK", "") == "1" }

// RunID returns a name part that no earlier run used.
func RunID() string {
	return strconv.FormatInt(time.Now().UnixNano(), 36) + deduptype.NewOwnerToken()[:4]
}

// Ready tells the fleet, through the worker's log, that SIGTERM now stops
// the worker gracefully.
func Ready() { fmt.Fprintln(os.Stderr, readyLine) }

// Fleet runs worker processes in slots, kills them and starts them again.
type Fleet struct {
	t      *testing.T
	env    string
	config func(slot int, name string) any
	dir    string
	procs  []*proc // by slot; nil while the slot is down

	mu       sync.Mutex
	killed   map[string]bool // names of the processes killed
	started  int
	logs     []string // one per process started
	unwanted []string // processes that exited without being told to
}

type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan error
	// ending is closed before the process is killed or told to stop.
	ending chan struct{}
}

// NewFleet starts n worker processes. Each is the test binary with env set
// to the JSON of config(slot, name); the test's TestMain runs the worker
// when env is set. Names read "w2#5": slot 2, the fifth process started.
// The logs go to a temporary directory, or to DEDUP_RELIABILITY_LOGS when
// set, and their tails are printed when t fails.
func NewFleet(t *testing.T, env string, n int, config func(slot int, name string) any) *Fleet {
	dir := testenv.Env("DEDUP_RELIABILITY_LOGS", "")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := &Fleet{t: t, env: env, config: config, dir: dir, procs: make([]*proc, n), killed: map[string]bool{}}
	t.Cleanup(func() {
		for i, p := range f.procs {
			if p != nil {
				close(p.ending)
				_ = p.cmd.Process.Kill()
				<-p.done
				f.procs[i] = nil
			}
		}
		if t.Failed() {
			f.dumpLogs()
		}
	})
	for i := range f.procs {
		f.Start(i)
	}
	return f
}

// Slots returns the number of slots.
func (f *Fleet) Slots() int { return len(f.procs) }

// Start starts a worker in slot i, which must be down.
func (f *Fleet) Start(i int) {
	f.t.Helper()
	f.mu.Lock()
	f.started++
	name := fmt.Sprintf("w%d#%d", i+1, f.started)
	f.mu.Unlock()
	raw, err := json.Marshal(f.config(i+1, name))
	if err != nil {
		f.t.Fatal(err)
	}
	logPath := filepath.Join(f.dir, strings.ReplaceAll(name, "#", "-")+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		f.t.Fatal(err)
	}
	defer logFile.Close()
	cmd := testenv.DieWithTest(exec.Command(os.Args[0], "-test.run=^$"))
	cmd.Env = append(os.Environ(), f.env+"="+string(raw))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start worker %s: %v", name, err)
	}
	p := &proc{name: name, log: logPath, cmd: cmd, done: make(chan error, 1), ending: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		select {
		case <-p.ending:
		default:
			f.mu.Lock()
			f.unwanted = append(f.unwanted, fmt.Sprintf("%s: %v", p.name, err))
			f.mu.Unlock()
		}
		p.done <- err
	}()
	f.procs[i] = p
	f.mu.Lock()
	f.logs = append(f.logs, logPath)
	f.mu.Unlock()
}

// Kill kills the worker in slot i with SIGKILL, as a crash would, and waits
// for it to exit.
func (f *Fleet) Kill(i int) {
	p := f.procs[i]
	close(p.ending)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	f.procs[i] = nil
	f.mu.Lock()
	f.killed[p.name] = true
	f.mu.Unlock()
}

// Down reports whether slot i has no process running.
func (f *Fleet) Down(i int) bool { return f.procs[i] == nil }

// Reap returns the slots whose worker exited on its own since the last
// call, and how; those slots are down afterwards.
func (f *Fleet) Reap() map[int]error {
	dead := map[int]error{}
	for i, p := range f.procs {
		if p == nil {
			continue
		}
		select {
		case err := <-p.done:
			dead[i] = err
			f.procs[i] = nil
		default:
		}
	}
	return dead
}

// Kills returns how many workers were killed.
func (f *Fleet) Kills() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.killed)
}

// WasKilled reports whether the worker named name was killed.
func (f *Fleet) WasKilled(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.killed[name]
}

// Restarts returns how many workers were started after the first ones.
func (f *Fleet) Restarts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started - len(f.procs)
}

// Crashed returns the workers that exited without being killed or stopped.
func (f *Fleet) Crashed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.unwanted...)
}

// Logs returns the paths of the workers' logs, one per process started.
func (f *Fleet) Logs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.logs...)
}

// Stop stops every running worker gracefully (SIGTERM), fails t for one
// that does not exit cleanly within Stall, and returns the names of those
// whose Run returned an error (exit code ExitRunError).
func (f *Fleet) Stop() (runErrors []string) {
	f.t.Helper()
	for _, p := range f.procs {
		if p != nil {
			f.waitReady(p)
			close(p.ending)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for i, p := range f.procs {
		if p == nil {
			continue
		}
		select {
		case err := <-p.done:
			var exit *exec.ExitError
			switch {
			case errors.As(err, &exit) && exit.ExitCode() == ExitRunError:
				runErrors = append(runErrors, p.name)
			case err != nil:
				f.t.Errorf("worker %s exited with %v after SIGTERM", p.name, err)
			}
		case <-time.After(Stall):
			f.t.Errorf("worker %s did not stop within %v of SIGTERM", p.name, Stall)
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		f.procs[i] = nil
	}
	return runErrors
}

// waitReady waits up to Stall for the worker to handle SIGTERM: a worker
// started on a loaded machine may take long to connect.
func (f *Fleet) waitReady(p *proc) {
	f.t.Helper()
	for deadline := time.Now().Add(Stall); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if b, _ := os.ReadFile(p.log); strings.Contains(string(b), readyLine) {
			return
		}
	}
	f.t.Errorf("worker %s not ready within %v", p.name, Stall)
}

// CheckLogs fails t if any worker reported a data race or a panic.
func (f *Fleet) CheckLogs() {
	f.t.Helper()
	for _, path := range f.Logs() {
		b, err := os.ReadFile(path)
		if err != nil {
			f.t.Error(err)
			continue
		}
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if strings.Contains(string(b), bad) {
				f.t.Errorf("worker log %s contains %q", filepath.Base(path), bad)
			}
		}
	}
}

// dumpLogs prints the tail of every worker's log, without the poison
// events' dead-letter lines (expected, and many).
func (f *Fleet) dumpLogs() {
	for _, path := range f.Logs() {
		b, _ := os.ReadFile(path)
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if !strings.Contains(l, "message dead-lettered") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 40 {
			lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-40)}, lines[len(lines)-40:]...)
		}
		f.t.Logf("==== %s\n%s", filepath.Base(path), strings.Join(lines, "\n"))
	}
}
