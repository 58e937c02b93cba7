package main

// The dashboard and the alert rules of deploy/ query metrics by their
// Prometheus names; these tests hold those names and labels to what a run
// of the SDK emits through the OpenTelemetry Prometheus exporter, so they
// cannot drift.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

const (
	dashboardFile = "../../deploy/grafana/dedup-dashboard.json"
	alertsFile    = "../../deploy/prometheus/dedup-alerts.yml"
	alertsTests   = "../../deploy/prometheus/dedup-alerts_test.yml"
	operationsDoc = "../../docs/operations.md"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// query is one PromQL expression of the dashboard or the rules, where it
// is, and the labels its legend or annotations show.
type query struct {
	where, expr string
	shows       []string
}

// TestDashboardAndAlertsQueryEmittedMetrics runs every part with every
// instrument exercised (a cycle of the example's workload: a consumer with
// successes, a retry, dead letters and an outage, an idemhttp middleware
// with replays and conflicts; a consumer whose outcome is lost; an outbox
// relay publishing, failing an event and reading its backlog), scrapes the
// exporter's /metrics, and checks each query of the dashboard and the alert
// rules: every metric it selects was emitted, with every label it matches
// or groups by or shows, and every literal value it matches is one a
// sample had.
func TestDashboardAndAlertsQueryEmittedMetrics(t *testing.T) {
	exp := newExporter(t)
	cycle(t, exp)
	scope := loseOutcome(t, exp)
	startRelay(t, exp)
	emitted := exp.scrape(t)
	if v, ok := emitted.value("dedup_outcomes_unrecorded_total", "dedup_scope", scope); !ok || v != 1 {
		t.Errorf("dedup_outcomes_unrecorded_total: %v (found: %v), want 1", v, ok)
	}

	queries := append(dashboardQueries(t), alertQueries(t)...)
	if len(queries) < 20 {
		t.Fatalf("found %d queries in the dashboard and the rules: the test no longer reads them right", len(queries))
	}
	used := map[string]bool{}
	for _, q := range queries {
		r, err := parseQuery(q.expr)
		if err != nil {
			t.Errorf("%s: %q: %v", q.where, q.expr, err)
			continue
		}
		for _, m := range r.metrics {
			used[m] = true
		}
		for _, p := range check(emitted, r, q.shows) {
			t.Errorf("%s: %q: %s", q.where, q.expr, p)
		}
	}
	// Every instrument the run emitted is on the dashboard (the leases
	// lost counter aside: no honest run of this size loses one).
	histogram := regexp.MustCompile(`_(bucket|sum|count)$`)
	for name := range emitted {
		base := histogram.ReplaceAllString(name, "")
		if strings.HasPrefix(name, "otel_") || name == "target_info" || name == "dedup_leases_lost_total" {
			continue
		}
		if !used[name] && !used[base+"_bucket"] && !used[base+"_count"] {
			t.Errorf("metric %s was emitted but neither the dashboard nor the rules query it", name)
		}
	}

	// The checker itself finds what drifted.
	for expr, want := range map[string]string{
		`rate(dedup_deliveries{dedup_scope="x"}[5m])`:                                "metric dedup_deliveries was not emitted",
		`sum by (dedup_scop) (dedup_deliveries_total)`:                               "groups by dedup_scop",
		`dedup_deliveries_total{dedup_outcome="dead_lettered"}`:                      `no sample of dedup_deliveries_total has dedup_outcome="dead_lettered"`,
		`idemhttp_requests_total{http_response_status_code=~"418|451"}`:              `matching "418|451"`,
		`max by (outbox_table) (outbox_pending{outbox="$table"})`:                    "outbox_pending has no label outbox",
		`sum by (dedup_scope) (rate(messaging_process_duration_seconds_bucket[5m]))`: "",
	} {
		r, err := parseQuery(expr)
		if err != nil {
			t.Fatalf("%q: %v", expr, err)
		}
		got := strings.Join(check(emitted, r, nil), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("check(%q) = %q, want a problem containing %q", expr, got, want)
		}
	}
}

// parseQuery finds the metrics, matchers and grouping labels of an
// expression, and no function, aggregation, keyword or range as a metric.
func TestParseQuery(t *testing.T) {
	got, err := parseQuery(`histogram_quantile(0.9, sum by (le, a) (rate(m_bucket{x="1", y=~"$v"}[$__rate_interval]))) > 0.5 and on (a) max without (b) (n offset 5m) unless sum(rate(o[5m:1m]))`)
	if err != nil {
		t.Fatal(err)
	}
	want := ref{
		metrics:  []string{"m_bucket", "n", "o"},
		matchers: []matcher{{"m_bucket", "x", "=", "1"}, {"m_bucket", "y", "=~", "$v"}},
		grouping: []string{"le", "a", "a", "b"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("parseQuery = %+v, want %+v", got, want)
	}
}

// check returns the problems of a query's ref against the emitted metrics.
func check(emitted exposition, r ref, shows []string) []string {
	var problems []string
	for _, m := range r.metrics {
		if emitted[m] == nil {
			problems = append(problems, "metric "+m+" was not emitted")
		}
	}
	for _, mt := range r.matchers {
		f := emitted[mt.metric]
		if f == nil {
			continue
		}
		values, ok := f.labels[mt.label]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s has no label %s", mt.metric, mt.label))
		case strings.Contains(mt.value, "$") || mt.op == "!=" || mt.op == "!~":
			// a dashboard variable, or a value excluded: the label is what counts
		case mt.op == "=" && !values[mt.value]:
			problems = append(problems, fmt.Sprintf("no sample of %s has %s=%q", mt.metric, mt.label, mt.value))
		case mt.op == "=~":
			re, err := regexp.Compile("^(?:" + mt.value + ")$")
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s=~%q: %v", mt.label, mt.value, err))
				break
			}
			if !slices.ContainsFunc(keys(values), re.MatchString) {
				problems = append(problems, fmt.Sprintf("no sample of %s has %s matching %q", mt.metric, mt.label, mt.value))
			}
		}
	}
	for _, l := range r.grouping {
		for _, m := range r.metrics {
			if f := emitted[m]; f != nil && f.labels[l] == nil {
				problems = append(problems, fmt.Sprintf("groups by %s, which %s does not have", l, m))
			}
		}
	}
	for _, l := range shows {
		if len(r.grouping) > 0 && !slices.Contains(r.grouping, l) {
			problems = append(problems, fmt.Sprintf("shows %s, which its aggregation drops", l))
		}
		for _, m := range r.metrics {
			if f := emitted[m]; f != nil && f.labels[l] == nil {
				problems = append(problems, fmt.Sprintf("shows %s, which %s does not have", l, m))
			}
		}
	}
	return problems
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// shown returns the labels a legend or annotation template shows.
func shown(templates ...string) []string {
	var out []string
	for _, s := range templates {
		for _, m := range templateLabels.FindAllStringSubmatch(s, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// dashboardQueries returns the dashboard's panel queries and its template
// variables' label_values queries (as the labels and metric they need).
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var text string
		if err := json.Unmarshal(v.Query, &text); err != nil {
			var obj struct{ Query string }
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				t.Fatalf("variable %s: query %s", v.Name, v.Query)
			}
			text = obj.Query
		}
		m := labelValues.FindStringSubmatch(text)
		if m == nil {
			t.Errorf("variable %s: %q is not a label_values query this test reads", v.Name, text)
			continue
		}
		if m[1] == "" {
			// label_values(label): any metric with the label
			qs = append(qs, query{where: "variable " + v.Name, expr: "dedup_deliveries_total", shows: []string{m[2]}},
				query{where: "variable " + v.Name, expr: "idemhttp_requests_total", shows: []string{m[2]}})
			continue
		}
		qs = append(qs, query{where: "variable " + v.Name, expr: m[1], shows: []string{m[2]}})
	}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, query{where: fmt.Sprintf("panel %q %s", p.Title, tg.RefID), expr: tg.Expr, shows: shown(tg.LegendFormat)})
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return qs
}

type panel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// rule is an alerting rule read from the rules file.
type rule struct {
	name, expr string
	templates  []string // the annotations and labels
	runbook    string
}

// alertRules reads the rules file's alerts: each "- alert:" item's expr
// (inline, or a block scalar folded or literal), its annotations and its
// runbook_url. The file is plain YAML that promtool validates in full
// (TestAlertRulesPromtool); this reader needs only those keys.
func alertRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var rules []rule
	indent := func(s string) int { return len(s) - len(strings.TrimLeft(s, " ")) }
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		switch {
		case strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "- alert:"):
			rules = append(rules, rule{name: strings.TrimSpace(strings.TrimPrefix(line, "- alert:"))})
		case len(rules) == 0:
		case strings.HasPrefix(line, "expr:"):
			v := strings.TrimSpace(strings.TrimPrefix(line, "expr:"))
			if v == ">-" || v == ">" || v == "|" || v == "|-" {
				var parts []string
				for at := indent(lines[i]); i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || indent(lines[i+1]) > at); i++ {
					parts = append(parts, strings.TrimSpace(lines[i+1]))
				}
				v = strings.TrimSpace(strings.Join(parts, " "))
			}
			rules[len(rules)-1].expr = v
		case strings.HasPrefix(line, "runbook_url:"):
			rules[len(rules)-1].runbook = strings.Trim(strings.TrimSpace(strings.TrimPrefix(line, "runbook_url:")), `"`)
		default:
			rules[len(rules)-1].templates = append(rules[len(rules)-1].templates, line)
		}
	}
	if n := strings.Count(string(b), "- alert:"); len(rules) != n || n == 0 {
		t.Fatalf("read %d alerts of %d in %s", len(rules), n, alertsFile)
	}
	return rules
}

func alertQueries(t *testing.T) []query {
	var qs []query
	for _, r := range alertRules(t) {
		if r.expr == "" {
			t.Errorf("alert %s: no expr", r.name)
		}
		qs = append(qs, query{where: "alert " + r.name, expr: r.expr, shows: shown(r.templates...)})
	}
	return qs
}

// Every alert has a runbook: a link to a heading of docs/operations.md
// that exists, and a for: duration.
func TestAlertRunbooks(t *testing.T) {
	doc, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[slug(m[1])] = true
	}
	const base = "https://github.com/dedupkit/dedup/blob/main/docs/operations.md#"
	rules := alertRules(t)
	for _, r := range rules {
		if !strings.HasPrefix(r.runbook, base) || !anchors[strings.TrimPrefix(r.runbook, base)] {
			t.Errorf("alert %s: runbook_url %q is not a heading of %s", r.name, r.runbook, operationsDoc)
		}
	}
	b, _ := os.ReadFile(alertsFile)
	if n := strings.Count(string(b), "\n        for: "); n != len(rules) {
		t.Errorf("%d for: durations for %d alerts", n, len(rules))
	}
}

// slug is GitHub's anchor of a heading.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The rules file is valid for Prometheus and its alerts fire as the unit
// tests of deploy/prometheus/dedup-alerts_test.yml say, and each panel's
// query is valid PromQL (checked as a recording rule, the dashboard's
// variables given values), when promtool is available (Debian's prometheus
// package; PROMTOOL names another). The drift test above does not depend on
// it.
func TestAlertRulesPromtool(t *testing.T) {
	tool := prometheusTool(t, "promtool", "PROMTOOL")
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__range", "6h", "$scope", ".*")
	var rules []map[string]string
	for i, q := range dashboardQueries(t) {
		if strings.HasPrefix(q.where, "panel ") {
			rules = append(rules, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", i), "expr": vars.Replace(q.expr)})
		}
	}
	b, err := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	panels := filepath.Join(t.TempDir(), "dashboard-queries.yml") // JSON is YAML
	if err := os.WriteFile(panels, b, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", alertsFile}, {"test", "rules", alertsTests}, {"check", "rules", panels}} {
		out, err := exec.Command(tool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
