package testenv

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A private service's start is bounded by its signs of life, not by a fixed
// time: on a busy two-core machine (a load average of 20) a JVM takes
// minutes where it takes seconds alone, and a fixed 60 s failed a start that
// was still under way.
const (
	// startStall is how long a starting service may show no sign of life
	// (no CPU time used, nothing logged) before it counts as stuck.
	startStall = 2 * time.Minute
	// startLimit bounds a start that keeps showing signs of life but never
	// answers.
	startLimit = 10 * time.Minute
	// probeTimeout bounds one readiness probe: a service that listens but
	// answers slowly is not refused for it.
	probeTimeout = 10 * time.Second
)

// awaitStart waits until ready answers nil for the service name, running as
// process pid (exited closed when it exits) and logging to logPath. It fails
// t, with the last probe's error and the log, when the process exits, shows
// no sign of life for startStall, or has not answered after startLimit.
func awaitStart(t testing.TB, name string, pid int, exited <-chan struct{}, logPath string, ready func(context.Context) error) {
	t.Helper()
	began := time.Now()
	last, livedAt := signsOfLife(pid, logPath), began
	for {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		err := ready(ctx)
		cancel()
		if err == nil {
			return
		}
		now := time.Now()
		if signs := signsOfLife(pid, logPath); signs != last {
			last, livedAt = signs, now
		}
		select {
		case <-exited:
			t.Fatalf("%s exited at start: %v\n%s", name, err, logTail(logPath))
		default:
		}
		switch {
		case now.Sub(livedAt) > startStall:
			t.Fatalf("%s showed no sign of life (CPU time, log) for %v while starting (%v in all): %v\n%s",
				name, startStall, now.Sub(began).Round(time.Second), err, logTail(logPath))
		case now.Sub(began) > startLimit:
			t.Fatalf("%s did not answer within %v of starting: %v\n%s", name, startLimit, err, logTail(logPath))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// signsOfLife returns the CPU time process pid used (from /proc, where there
// is one) and the size of its log: what grows while a service starts.
func signsOfLife(pid int, logPath string) [2]int64 {
	var signs [2]int64
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		// utime and stime are fields 14 and 15; the command name, field
		// 2, may hold spaces but ends at the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 12 {
				utime, _ := strconv.ParseInt(f[11], 10, 64)
				stime, _ := strconv.ParseInt(f[12], 10, 64)
				signs[0] = utime + stime
			}
		}
	}
	if st, err := os.Stat(logPath); err == nil {
		signs[1] = st.Size()
	}
	return signs
}

// logTail returns the end of the log at path, for a failure message.
func logTail(path string) string {
	b, _ := os.ReadFile(path)
	const max = 4000
	if len(b) > max {
		b = append([]byte("..."), b[len(b)-max:]...)
	}
	return string(b)
}
