package deps

import (
	"bufio"
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is this module's path; a package of it is module or module + "/...".
const module = "github.com/dedupkit/dedup"

// depRule is one rule on the module's import graph: no package that from
// matches may reach a package that to matches.
type depRule struct {
	name string
	from func(pkg string) bool
	to   func(pkg string) bool
	// direct restricts the rule to from's own imports; otherwise what they
	// import counts too.
	direct bool
}

// pkgUnder reports whether pkg is dir (relative to the module) or below it.
func pkgUnder(dir string) func(string) bool {
	return func(pkg string) bool { return pkg == module+"/"+dir || strings.HasPrefix(pkg, module+"/"+dir+"/") }
}

// pkgIs reports whether pkg is rel (relative to the module; "" is the root).
func pkgIs(rel string) func(string) bool {
	path := module
	if rel != "" {
		path += "/" + rel
	}
	return func(pkg string) bool { return pkg == path }
}

// inModule reports whether pkg is a package of this module.
func inModule(pkg string) bool { return pkg == module || strings.HasPrefix(pkg, module+"/") }

// depRules are the edges the module's layout forbids (CONTRIBUTING.md,
// "Packages and their edges"). Test files are not held to them: an
// outbox test may consume what it published with an adapter.
var depRules = []depRule{
	{name: "a publisher depends on no consumer adapter (a shared wire name belongs in internal/wire)",
		from: pkgUnder("outbox"), to: pkgUnder("adapters")},
	{name: "no internal package depends on the root package",
		from: pkgUnder("internal"), to: pkgIs("")},
	{name: "the root package imports only deduptype and internal packages of the module",
		from: pkgIs(""), direct: true, to: func(pkg string) bool {
			return inModule(pkg) && !pkgUnder("internal")(pkg) && !pkgIs("deduptype")(pkg)
		}},
	{name: "deduptype, the leaf at the bottom, depends on nothing of the module",
		from: pkgIs("deduptype"), to: inModule},
	{name: "internal/wire, the names producer and consumer share, depends on nothing of the module",
		from: pkgIs("internal/wire"), to: inModule},
}

// short is pkg's path within the module, or the module's for the root.
func short(pkg string) string {
	if pkg == module {
		return module
	}
	return strings.TrimPrefix(pkg, module+"/")
}

// violations returns, for each package that breaks a rule, the rule and the
// chain of imports that breaks it, ending in the offending edge. imports
// is the graph: a package's own (not its tests') imports.
func violations(imports map[string][]string, rules []depRule) []string {
	var out []string
	pkgs := make([]string, 0, len(imports))
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, r := range rules {
		for _, p := range pkgs {
			if !r.from(p) {
				continue
			}
			if chain := reach(imports, p, r); chain != nil {
				for i := range chain {
					chain[i] = short(chain[i])
				}
				edge := chain[len(chain)-2] + " imports " + chain[len(chain)-1]
				if len(chain) > 2 {
					edge += " (" + strings.Join(chain, " -> ") + ")"
				}
				out = append(out, r.name+": "+edge)
			}
		}
	}
	return out
}

// reach returns the shortest import chain from start to a package r
// forbids, or nil.
func reach(imports map[string][]string, start string, r depRule) []string {
	parent := map[string]string{start: ""}
	queue := []string{start}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, q := range imports[p] {
			if _, seen := parent[q]; seen {
				continue
			}
			parent[q] = p
			if r.to(q) {
				chain := []string{q}
				for at := p; at != ""; at = parent[at] {
					chain = append(chain, at)
				}
				slices.Reverse(chain)
				return chain
			}
			if !r.direct {
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// moduleImports lists every package of the module with its imports of the
// module's packages, from go list (-e: an import cycle, which fails the
// build, is still listed, and a rule names its edge).
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which lists the packages, is not on PATH: %v", err)
	}
	cmd := exec.Command(gobin, "list", "-e", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	imports := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		imports[fields[0]] = slices.DeleteFunc(fields[1:], func(p string) bool { return !inModule(p) })
	}
	if len(imports) < 10 || imports[module] == nil {
		t.Fatalf("go list found %d packages, the root's imports %q: not this module's graph\n%s", len(imports), imports[module], out)
	}
	return imports
}

// The module's packages import one another only as its layout allows.
func TestDependencyRules(t *testing.T) {
	for _, v := range violations(moduleImports(t), depRules) {
		t.Error(v)
	}
}

// Each rule catches the edge it forbids, however deep, and names it.
func TestDependencyRulesNameTheOffendingEdge(t *testing.T) {
	graph := map[string][]string{
		module:                          {module + "/deduptype", module + "/internal/outage"},
		module + "/deduptype":           nil,
		module + "/internal/outage":     nil,
		module + "/internal/wire":       nil,
		module + "/outbox":              {module},
		module + "/outbox/kafkaoutbox":  {module + "/outbox", module + "/internal/wire"},
		module + "/adapters/kafkadedup": {module, module + "/internal/wire"},
	}
	if v := violations(graph, depRules); len(v) != 0 {
		t.Fatalf("a graph the rules allow breaks them: %q", v)
	}
	for _, tc := range []struct {
		from, to string
		want     string
	}{
		{module + "/outbox/kafkaoutbox", module + "/adapters/kafkadedup",
			"a publisher depends on no consumer adapter (a shared wire name belongs in internal/wire): " +
				"outbox/kafkaoutbox imports adapters/kafkadedup"},
		{module + "/internal/wire", module + "/adapters/kafkadedup",
			"internal/wire imports adapters/kafkadedup (outbox/kafkaoutbox -> internal/wire -> adapters/kafkadedup)"},
		{module + "/internal/outage", module + "/outbox",
			"outbox imports " + module + " (internal/outage -> outbox -> " + module + ")"},
		{module, module + "/outbox", module + " imports outbox"},
		{module + "/deduptype", module + "/internal/outage", "deduptype imports internal/outage"},
	} {
		bad := make(map[string][]string, len(graph))
		for p, imps := range graph {
			bad[p] = slices.Clone(imps)
		}
		bad[tc.from] = append(bad[tc.from], tc.to)
		v := violations(bad, depRules)
		if !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("with %s importing %s: violations %q, want one naming %q", tc.from, tc.to, v, tc.want)
		}
	}
}
