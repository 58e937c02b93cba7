package dedup_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dedupkit/dedup"
	"github.com/dedupkit/dedup/idemhttp"
	"github.com/dedupkit/dedup/outbox"
)

// operationsDoc is the page whose lists of names TestOperationsDocNames
// holds to the code.
const operationsDoc = "docs/operations.md"

// TestOperationsDocNames checks that docs/operations.md names what the code
// has, no more and no less: the consumer adapters (adapters/*), the outbox
// publishers (outbox/*), the OpenTelemetry instruments the parts register,
// and the dedup command's commands and redrive transports.
func TestOperationsDocNames(t *testing.T) {
	b, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)

	t.Run("adapters", func(t *testing.T) {
		compareDocNames(t, "adapter", packageDirs(t, "adapters"), docWordsEnding(doc, "dedup"))
	})
	t.Run("publishers", func(t *testing.T) {
		compareDocNames(t, "outbox publisher", packageDirs(t, "outbox"), docWordsEnding(doc, "outbox"))
	})
	t.Run("metrics", func(t *testing.T) {
		code := registeredInstruments(t)
		for name, where := range instrumentsInSource(t) {
			if _, ok := code[name]; !ok {
				code[name] = where
			}
		}
		compareDocNames(t, "metric", code, docMetricsTable(t, doc))
	})
	t.Run("commands", func(t *testing.T) {
		compareDocNames(t, "command", dedupCommands(t), docTableMatches(doc, "`dedup ([a-z]+)"))
	})
	t.Run("redrive", func(t *testing.T) {
		compareDocNames(t, "redrive transport", redriveTransports(t), docTableMatches(doc, "`dedup redrive ([a-z]+)"))
	})
}

// compareDocNames fails t for each name of the code (name to where it was
// found) the doc lacks and each name of the doc the code lacks.
func compareDocNames(t *testing.T, kind string, code map[string]string, doc map[string]bool) {
	t.Helper()
	if len(code) == 0 {
		t.Fatalf("found no %s in the code: the test no longer reads it right", kind)
	}
	for _, name := range sortedDocNames(code) {
		if !doc[name] {
			t.Errorf("%s %q (%s) is missing from %s", kind, name, code[name], operationsDoc)
		}
	}
	for _, name := range sortedDocNames(doc) {
		if _, ok := code[name]; !ok {
			t.Errorf("%s names %s %q, which the code does not have", operationsDoc, kind, name)
		}
	}
}

func sortedDocNames[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// packageDirs returns the package directories under dir, each with its path.
func packageDirs(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for _, e := range entries {
		if e.IsDir() && e.Name() != "testdata" {
			names[e.Name()] = filepath.Join(dir, e.Name())
		}
	}
	return names
}

// docWordsEnding returns the words of doc made of a lower-case prefix and
// suffix, such as kafkadedup for "dedup": the way the doc names a package.
func docWordsEnding(doc, suffix string) map[string]bool {
	words := map[string]bool{}
	for _, w := range regexp.MustCompile(`\b[a-z0-9]+`+suffix+`\b`).FindAllString(doc, -1) {
		words[w] = true
	}
	return words
}

// docTableMatches returns the first group of pattern's matches in doc's table
// rows.
func docTableMatches(doc, pattern string) map[string]bool {
	re := regexp.MustCompile(pattern)
	names := map[string]bool{}
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(line, "|") {
			continue
		}
		for _, m := range re.FindAllStringSubmatch(line, -1) {
			names[m[1]] = true
		}
	}
	return names
}

// docMetricsTable returns the instrument names in the first column of the
// table under the doc's "### Metrics" heading.
func docMetricsTable(t *testing.T, doc string) map[string]bool {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n### Metrics\n")
	if !ok {
		t.Fatalf("%s has no \"### Metrics\" section", operationsDoc)
	}
	if end := strings.Index(section, "\n#"); end >= 0 {
		section = section[:end]
	}
	return docTableMatches(section, "^\\| `([a-z_.]+)`")
}

// registeredInstruments builds the wrapper, an idemhttp middleware and an
// outbox relay with a meter provider and returns the names of the
// instruments they register, each with its meter's name: the metrics these
// parts emit. No service is needed: the relay connects only when it runs.
func registeredInstruments(t *testing.T) map[string]string {
	t.Helper()
	names := map[string]string{}
	record := func(i sdkmetric.Instrument) (sdkmetric.Stream, bool) {
		names[i.Name] = "registered by " + i.Scope.Name
		return sdkmetric.Stream{}, false // the default stream: only the name is wanted
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()), sdkmetric.WithView(record))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	_, err := dedup.Wrap(dedup.NewMemoryStore(), orderMessages,
		func(context.Context, Order) error { return nil },
		dedup.WithScope("drift/wrap"), dedup.WithSink(dedup.NewMemorySink()), dedup.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemhttp.New(dedup.NewMemoryStore(), idemhttp.WithScope("drift-http"), idemhttp.WithMeterProvider(mp)); err != nil {
		t.Fatal(err)
	}
	ob, err := outbox.New()
	if err != nil {
		t.Fatal(err)
	}
	pg, err := pgxpool.ParseConfig("postgres://127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.NewRelay(ob, pg, driftPublisher{}, outbox.WithMeterProvider(mp)); err != nil {
		t.Fatal(err)
	}
	return names
}

// driftPublisher is a Publisher that is never called.
type driftPublisher struct{}

func (driftPublisher) Publish(context.Context, []outbox.Event) []error { panic("not called") }

// instrumentMethod matches the metric.Meter methods that register an
// instrument.
var instrumentMethod = regexp.MustCompile(`^(Int64|Float64)(Observable)?(Counter|UpDownCounter|Histogram|Gauge)$`)

// instrumentsInSource returns the instrument names the module's library
// code (its non-test files outside cmd, examples and bench) passes to a
// meter, each with its position: the parts registeredInstruments does not
// build, such as a new adapter's, are held to the doc too. A name that is
// not a string literal fails t, as it could drift unseen.
func instrumentsInSource(t *testing.T) map[string]string {
	t.Helper()
	names := map[string]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || slices.Contains([]string{"cmd", "examples", "bench", "testdata"}, d.Name())) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !instrumentMethod.MatchString(sel.Sel.Name) {
				return true
			}
			pos := fset.Position(call.Pos())
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: %s is given a name that is not a string literal: %s cannot be checked against it", pos, sel.Sel.Name, operationsDoc)
				return true
			}
			name, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Errorf("%s: %v", pos, err)
				return true
			}
			names[name] = "created at " + pos.String()
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// dedupCommands returns the names in cmd/dedup/main.go's commands list.
func dedupCommands(t *testing.T) map[string]string {
	t.Helper()
	const file = "cmd/dedup/main.go"
	f := parseGoFile(t, file)
	names := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok || len(spec.Names) != 1 || spec.Names[0].Name != "commands" || len(spec.Values) != 1 {
			return true
		}
		list, ok := spec.Values[0].(*ast.CompositeLit)
		if !ok {
			return false
		}
		for _, elt := range list.Elts {
			if c, ok := elt.(*ast.CompositeLit); ok && len(c.Elts) > 0 {
				if name, ok := goStringLit(c.Elts[0]); ok {
					names[name] = "in " + file + "'s commands"
				}
			}
		}
		return false
	})
	return names
}

// redriveTransports returns the transports runRedrive in
// cmd/dedup/redrive.go switches on.
func redriveTransports(t *testing.T) map[string]string {
	t.Helper()
	const file = "cmd/dedup/redrive.go"
	f := parseGoFile(t, file)
	names := map[string]string{}
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "runRedrive" {
			continue
		}
		ast.Inspect(fn, func(n ast.Node) bool {
			if cc, ok := n.(*ast.CaseClause); ok {
				for _, e := range cc.List {
					if name, ok := goStringLit(e); ok {
						names[name] = "a case of runRedrive in " + file
					}
				}
			}
			return true
		})
	}
	return names
}

func parseGoFile(t *testing.T, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func goStringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	s, err := strconv.Unquote(lit.Value)
	return s, err == nil
}
