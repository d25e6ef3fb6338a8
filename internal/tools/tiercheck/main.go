// Command tiercheck enforces the layering of the module: every package
// belongs to a tier, and a package imports only packages of its own tier
// or lower ones. `make lint` runs it (through .ci/lint-rules) over the
// whole module:
//
//	go run ./internal/tools/tiercheck [-C dir] [packages]
//
// The tiers, lowest first, are the table tiers below; a package of the
// module that no tier names is an error too, so a new directory gets a
// tier when it is created. Tests are held to the same rule, except for
// the few upward test imports listed in testExceptions with their reasons.
//
// It prints one line per offending import and exits 1 if there is any,
// 2 if the packages cannot be listed.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// A tier is a layer of the module: the packages at or below any of its
// paths (module-relative).
type tier struct {
	name  string
	paths []string
}

// tiers, lowest first. A package may import its own tier and lower ones.
var tiers = []tier{
	// Leaves: memory, processes, queues, the kernel's VFIO interface.
	{"prim", []string{"internal/prim", "qos", "vfio"}},
	// The NTB device model and its backends; the wire formats between
	// processes.
	{"link", []string{"ntb", "internal/wire"}},
	// Transports over a device or a network: the partition handshake,
	// RDMA, the connection engine.
	{"transport", []string{"partition", "rdma", "internal/transport"}},
	// The public socket API.
	{"api", []string{"socklike"}},
	// The daemons' libraries.
	{"daemon", []string{"internal/daemon"}},
	// Programs, developer tools and the integration tests.
	{"tools", []string{"internal/tools", "cmd", "test"}},
}

// testExceptions are the upward imports a package's tests may make:
// importing package -> imported package -> why.
var testExceptions = map[string]map[string]string{
	"ntb/ivshmem": {
		"internal/transport": "TestDeviceSocklikeEcho runs the transport engine end to end over the backend",
	},
	"internal/daemon/proxy": {
		"internal/tools/workload": "TestCaptureKV captures the frames of a real KV workload",
	},
}

// tierOf returns the index in tiers of a module-relative package path, or
// -1 if no tier names it.
func tierOf(rel string) int {
	best, bestLen := -1, -1
	for i, t := range tiers {
		for _, p := range t.paths {
			if (rel == p || strings.HasPrefix(rel, p+"/")) && len(p) > bestLen {
				best, bestLen = i, len(p)
			}
		}
	}
	return best
}

// Package is the part of `go list -json`'s output tiercheck reads.
type Package struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Module       *struct{ Path string }
}

// Violation is one import that breaks the rule.
type Violation struct {
	From, To string // module-relative package paths; To is "" for an untiered From
	Test     bool   // the import is made by From's tests
	Why      string
}

func (v Violation) String() string {
	what := "imports"
	if v.Test {
		what = "tests import"
	}
	if v.To == "" {
		return fmt.Sprintf("tiercheck: %s: %s", v.From, v.Why)
	}
	return fmt.Sprintf("tiercheck: %s %s %s: %s", v.From, what, v.To, v.Why)
}

// Check returns the imports of pkgs that break the tier rule, in the
// order of pkgs. module is the module path the tiers' paths are relative
// to; imports from outside the module are not checked.
func Check(module string, pkgs []Package) []Violation {
	rel := func(path string) (string, bool) {
		if path == module {
			return "", true
		}
		r, ok := strings.CutPrefix(path, module+"/")
		return r, ok
	}
	var out []Violation
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		ft := tierOf(from)
		if ft < 0 {
			out = append(out, Violation{From: from, Why: "in no tier; add it to the tiers of internal/tools/tiercheck"})
			continue
		}
		check := func(imports []string, test bool) {
			for _, imp := range imports {
				to, ok := rel(imp)
				if !ok || to == from {
					continue
				}
				tt := tierOf(to)
				switch {
				case tt < 0:
					out = append(out, Violation{From: from, To: to, Test: test,
						Why: "the imported package is in no tier"})
				case tt > ft && !(test && testExceptions[from][to] != ""):
					out = append(out, Violation{From: from, To: to, Test: test,
						Why: fmt.Sprintf("tier %s may not import tier %s", tiers[ft].name, tiers[tt].name)})
				}
			}
		}
		check(p.Imports, false)
		check(slices.Concat(p.TestImports, p.XTestImports), true)
	}
	return out
}

// List runs `go list -json` on patterns in dir and returns the module's
// path and its packages.
func List(dir string, patterns ...string) (string, []Package, error) {
	cmd := exec.Command("go", append([]string{"list", "-json"}, patterns...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var pkgs []Package
	module := ""
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p Package
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", nil, fmt.Errorf("go list: decode: %w", err)
		}
		if p.Module == nil {
			continue // a standard-library package named on the command line
		}
		if module == "" {
			module = p.Module.Path
		} else if module != p.Module.Path {
			return "", nil, fmt.Errorf("go list: packages of two modules, %s and %s", module, p.Module.Path)
		}
		pkgs = append(pkgs, p)
	}
	if module == "" {
		return "", nil, errors.New("go list: no packages of a module")
	}
	return module, pkgs, nil
}

func main() {
	dir := flag.String("C", ".", "run go list in `dir`")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: tiercheck [-C dir] [packages]\n\nFails when a package imports a package of a higher tier.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	patterns := flag.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	module, pkgs, err := List(*dir, patterns...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tiercheck:", err)
		os.Exit(2)
	}
	vs := Check(module, pkgs)
	for _, v := range vs {
		fmt.Println(v)
	}
	if len(vs) > 0 {
		os.Exit(1)
	}
}
