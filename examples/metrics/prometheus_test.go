package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupkit/dedup/internal/testenv"
)

// A real Prometheus scraping the exporter after the drift test's run
// answers every panel query of the dashboard with at least one series,
// when the prometheus server is installed (Debian's prometheus package;
// PROMETHEUS names another binary).
func TestDashboardQueriesAnswered(t *testing.T) {
	bin := prometheusTool(t, "prometheus", "PROMETHEUS")
	exp := newExporter(t)
	defer http.DefaultClient.CloseIdleConnections()
	cycle(t, exp)
	loseOutcome(t, exp)
	startRelay(t, exp)

	api := startPrometheus(t, bin, strings.TrimPrefix(exp.srv.URL, "http://"))
	vars := strings.NewReplacer("$__rate_interval", "30s", "$__range", "5m", "$scope", ".*")
	deadline := time.Now().Add(2 * time.Minute)
	for _, q := range dashboardQueries(t) {
		if !strings.HasPrefix(q.where, "panel ") {
			continue
		}
		expr := vars.Replace(q.expr)
		for {
			n, err := seriesCount(api, expr)
			if err == nil && n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %q: no series from Prometheus within 2 min (last: %d series, %v)", q.where, expr, n, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// prometheusTool returns the path of a program of Debian's prometheus
// package, name, or the one the environment variable env names. Without
// one the test skips, but fails under CI=true, where make services has
// installed the package: these checks are extras that the drift test does
// not depend on, not ones to lose unnoticed.
func prometheusTool(t *testing.T, name, env string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not installed (make services installs Debian's prometheus package; or set %s)", name, env)
		}
		t.Skipf("%s not installed (apt-get install prometheus, or set %s)", name, env)
	}
	return p
}

// startPrometheus runs a Prometheus scraping target each second until the
// test ends, and returns its API's URL once it is ready.
func startPrometheus(t *testing.T, bin, target string) string {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "prometheus.yml")
	err := os.WriteFile(conf, []byte(fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: dedup
    static_configs: [{targets: [%q]}]
`, target)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logs, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	cmd := testenv.DieWithTest(exec.Command(bin, "--config.file="+conf, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr))
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	base := "http://" + addr
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("prometheus exited: %v\n%s", err, b)
		default:
		}
		if resp, err := http.Get(base + "/-/ready"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("prometheus not ready in 2 min:\n%s", b)
		}
	}
}

// seriesCount returns how many series Prometheus answers expr with now.
func seriesCount(api, expr string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, api+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, err
	}
	if body.Status != "success" {
		return 0, fmt.Errorf("%s: %s", body.Status, body.Error)
	}
	return len(body.Data.Result), nil
}
