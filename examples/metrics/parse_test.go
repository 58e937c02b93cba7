package main

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// exposition is a scrape in the Prometheus text format: for each metric
// name (a histogram's _bucket, _sum and _count apart), its labels, each
// with the values seen, and the samples.
type exposition map[string]*family

type family struct {
	labels  map[string]map[string]bool
	samples []point
}

type point struct {
	labels map[string]string
	value  float64
}

// value returns the value of name's sample having the labels given as
// name, value pairs, and whether there is one.
func (x exposition) value(name string, labels ...string) (float64, bool) {
	if f := x[name]; f != nil {
	samples:
		for _, s := range f.samples {
			for i := 0; i+1 < len(labels); i += 2 {
				if s.labels[labels[i]] != labels[i+1] {
					continue samples
				}
			}
			return s.value, true
		}
	}
	return 0, false
}

// parseExposition parses the text format: `name{label="value",...} value`
// lines, comments skipped.
func parseExposition(text string) (exposition, error) {
	x := exposition{}
	for n, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, labels := line, "", map[string]string{}
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			var err error
			if labels, rest, err = parseLabels(rest[1:]); err != nil {
				return nil, fmt.Errorf("line %d %q: %w", n+1, line, err)
			}
		}
		fields := strings.Fields(rest)
		if name == "" || len(fields) == 0 {
			return nil, fmt.Errorf("line %d %q: no sample", n+1, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d %q: %w", n+1, line, err)
		}
		f := x[name]
		if f == nil {
			f = &family{labels: map[string]map[string]bool{}}
			x[name] = f
		}
		for k, val := range labels {
			if f.labels[k] == nil {
				f.labels[k] = map[string]bool{}
			}
			f.labels[k][val] = true
		}
		f.samples = append(f.samples, point{labels: labels, value: v})
	}
	return x, nil
}

// parseLabels parses `label="value",...}` and returns what follows.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	for {
		s = strings.TrimLeft(s, ", ")
		if strings.HasPrefix(s, "}") {
			return labels, s[1:], nil
		}
		eq := strings.Index(s, `="`)
		if eq <= 0 {
			return nil, "", fmt.Errorf("label without a value at %q", s)
		}
		key := s[:eq]
		s = s[eq+2:]
		var b strings.Builder
		for {
			if s == "" {
				return nil, "", fmt.Errorf("label %s: unterminated value", key)
			}
			c := s[0]
			s = s[1:]
			if c == '"' {
				break
			}
			if c == '\\' && s != "" {
				switch s[0] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[0])
				}
				s = s[1:]
				continue
			}
			b.WriteByte(c)
		}
		labels[key] = b.String()
	}
}

// A ref is what a query needs of the emitted metrics: the metrics it
// selects, the labels it matches on each (with the value when it is a
// literal), and the labels it groups by.
type ref struct {
	metrics  []string
	matchers []matcher
	grouping []string
}

type matcher struct {
	metric, label, op, value string
}

// token is a PromQL token: an identifier, a string (unquoted), a number, or
// punctuation.
type token struct {
	kind byte // 'i' identifier, 's' string, 'n' number, 'p' punctuation
	text string
}

func lex(q string) ([]token, error) {
	var toks []token
	for i := 0; i < len(q); {
		c := rune(q[i])
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '#': // a comment to the end of the line
			for i < len(q) && q[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(q) && rune(q[j]) != c {
				if q[j] == '\\' && c != '`' {
					j++
				}
				j++
			}
			if j >= len(q) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			s := q[i : j+1]
			if c != '`' {
				u, err := strconv.Unquote(`"` + strings.ReplaceAll(s[1:len(s)-1], `"`, `\"`) + `"`)
				if err != nil {
					return nil, fmt.Errorf("string %s: %w", s, err)
				}
				s = u
			} else {
				s = s[1 : len(s)-1]
			}
			toks = append(toks, token{'s', s})
			i = j + 1
		case c == '[': // a range or subquery: nothing in it names a metric
			j := strings.IndexByte(q[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated [ at %d", i)
			}
			i += j + 1
		case c == '_' || c == ':' || unicode.IsLetter(c):
			j := i
			for j < len(q) && (q[j] == '_' || q[j] == ':' || unicode.IsLetter(rune(q[j])) || unicode.IsDigit(rune(q[j]))) {
				j++
			}
			toks = append(toks, token{'i', q[i:j]})
			i = j
		case unicode.IsDigit(c) || c == '.':
			j := i
			for j < len(q) && (q[j] == '.' || unicode.IsDigit(rune(q[j])) || unicode.IsLetter(rune(q[j]))) { // 0.5, 1e3, 5m, 1h30m
				j++
			}
			toks = append(toks, token{'n', q[i:j]})
			i = j
		default:
			if i+1 < len(q) && slices.Contains([]string{"=~", "!~", "!=", "==", ">=", "<="}, q[i:i+2]) {
				toks = append(toks, token{'p', q[i : i+2]})
				i += 2
				continue
			}
			if !strings.ContainsRune("(){},=<>+-*/^%", c) {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			toks = append(toks, token{'p', string(c)})
			i++
		}
	}
	return toks, nil
}

// keywords are PromQL's identifiers that name no metric.
var keywords = []string{"and", "or", "unless", "bool", "offset", "inf", "nan"}

// groupers are followed by a list of label names.
var groupers = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}

// parseQuery returns what the PromQL expression q needs.
func parseQuery(q string) (ref, error) {
	toks, err := lex(q)
	if err != nil {
		return ref{}, err
	}
	var r ref
	next := func(i int) token {
		if i+1 < len(toks) {
			return toks[i+1]
		}
		return token{}
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		switch {
		case t.kind == 'i' && slices.Contains(groupers, strings.ToLower(t.text)):
			if next(i).text != "(" {
				continue // group_left without labels
			}
			for i += 2; i < len(toks) && toks[i].text != ")"; i++ {
				if toks[i].kind == 'i' {
					r.grouping = append(r.grouping, toks[i].text)
				}
			}
		case t.kind == 'i' && slices.Contains(keywords, strings.ToLower(t.text)):
		case t.kind == 'i' && next(i).text == "(": // a function or an aggregation
		case t.kind == 'i' && slices.Contains([]string{"by", "without"}, strings.ToLower(next(i).text)): // sum by (...) (...)
		case t.kind == 'i':
			r.metrics = append(r.metrics, t.text)
			if next(i).text == "{" {
				i++
				ms, end, err := parseMatchers(toks, i+1, t.text)
				if err != nil {
					return ref{}, fmt.Errorf("%s: %w", t.text, err)
				}
				r.matchers, i = append(r.matchers, ms...), end
			}
		case t.text == "{":
			return ref{}, fmt.Errorf("a selector without a metric name: the test cannot check it")
		}
	}
	return r, nil
}

// parseMatchers parses `label op "value", ...}` from toks[i], for metric,
// and returns the index of the closing brace.
func parseMatchers(toks []token, i int, metric string) ([]matcher, int, error) {
	var ms []matcher
	for ; i < len(toks); i++ {
		switch {
		case toks[i].text == "}":
			return ms, i, nil
		case toks[i].text == ",":
		case toks[i].kind == 'i' && i+2 < len(toks) && toks[i+2].kind == 's':
			ms = append(ms, matcher{metric: metric, label: toks[i].text, op: toks[i+1].text, value: toks[i+2].text})
			i += 2
		default:
			return nil, 0, fmt.Errorf("unexpected %q in a selector", toks[i].text)
		}
	}
	return nil, 0, fmt.Errorf("unterminated selector")
}

// labelValues matches Grafana's label_values(label) and
// label_values(metric, label) variable queries.
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(?:([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

// templateLabels matches the labels a legend ({{label}}) or an alert's
// annotation ({{ $labels.label }}) shows.
var templateLabels = regexp.MustCompile(`\{\{\s*(?:\$labels\.)?([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
