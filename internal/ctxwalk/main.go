// Command ctxwalk follows a context.Context down the static call graph
// from one function and prints the walk: each function reached through a
// call that passes the context on, depth first, with its file. It counts
// how often the walk returns to a file it had left — read in the walk's
// order, and along each chain of calls (the most a reader following ctx
// from the start down one chain goes back to a file already read).
//
// Usage: go run ./internal/ctxwalk ./train 'Replica.Step'
//
// A call through an interface goes to every type of the caller's own
// package that implements it: a reader of train who meets
// Collective.AllreduceMean reads on in train, not in the packages that
// happen to implement Collective.
package main

import (
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/packages"
)

type fn struct {
	obj  *types.Func
	decl *ast.FuncDecl
	pkg  *packages.Package
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: ctxwalk <packages> <Type.Method or Func>")
		os.Exit(2)
	}
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedFiles | packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo}
	pkgs, err := packages.Load(cfg, strings.Split(os.Args[1], ",")...)
	if err != nil || packages.PrintErrors(pkgs) > 0 {
		fmt.Fprintln(os.Stderr, "ctxwalk: loading:", err)
		os.Exit(1)
	}
	fns := map[*types.Func]fn{}
	var named []*types.Named
	for _, p := range pkgs {
		for _, f := range p.Syntax {
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					if obj, ok := p.TypesInfo.Defs[fd.Name].(*types.Func); ok {
						fns[obj] = fn{obj, fd, p}
					}
				}
			}
		}
		for _, n := range p.Types.Scope().Names() {
			if tn, ok := p.Types.Scope().Lookup(n).(*types.TypeName); ok {
				if nt, ok := tn.Type().(*types.Named); ok {
					named = append(named, nt)
				}
			}
		}
	}
	var start *fn
	for o, f := range fns {
		if name(o) == os.Args[2] {
			start = &f
		}
	}
	if start == nil {
		fmt.Fprintln(os.Stderr, "ctxwalk: no function", os.Args[2])
		os.Exit(1)
	}
	seen := map[*types.Func]bool{}
	var files, path []string
	worst, worstPath := 0, ""
	var walk func(f fn, depth int)
	walk = func(f fn, depth int) {
		seen[f.obj] = true
		file := filepath.Base(f.pkg.Fset.Position(f.decl.Pos()).Filename)
		files = append(files, file)
		path = append(path, file)
		defer func() { path = path[:len(path)-1] }()
		if n := returns(path); n > worst {
			worst, worstPath = n, strings.Join(path, " → ")
		}
		fmt.Printf("%s%s  (%s)\n", strings.Repeat("  ", depth), name(f.obj), file)
		ctx := ctxParam(f)
		if ctx == nil {
			return
		}
		ast.Inspect(f.decl.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || !passes(call, ctx, f.pkg.TypesInfo) {
				return true
			}
			for _, callee := range callees(call, f.pkg.TypesInfo, named, f.pkg.Types) {
				if g, ok := fns[callee]; ok && !seen[callee] {
					walk(g, depth+1)
				}
			}
			return true
		})
	}
	walk(*start, 0)
	fmt.Printf("%d functions in %d files; read in this order, a file already left is returned to %d times;\n", len(files), len(uniq(files)), returns(files))
	if worst == 0 {
		fmt.Println("along any one chain of calls, never")
		return
	}
	fmt.Printf("along one chain of calls, at most %d times: %s\n", worst, worstPath)
}

// returns counts how often files, in order, go back to a file they had
// left.
func returns(files []string) int {
	back, left := 0, map[string]bool{}
	for i, f := range files {
		if i > 0 && f != files[i-1] {
			if left[f] {
				back++
			}
			left[files[i-1]] = true
		}
	}
	return back
}

func uniq(ss []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range ss {
		m[s] = true
	}
	return m
}

func name(o *types.Func) string {
	sig := o.Type().(*types.Signature)
	if r := sig.Recv(); r != nil {
		t := r.Type()
		if p, ok := t.(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := t.(*types.Named); ok {
			return n.Obj().Name() + "." + o.Name()
		}
	}
	return o.Name()
}

// ctxParam is f's context.Context parameter, or nil.
func ctxParam(f fn) types.Object {
	sig := f.obj.Type().(*types.Signature)
	for i := range sig.Params().Len() {
		if v := sig.Params().At(i); v.Type().String() == "context.Context" {
			return v
		}
	}
	return nil
}

// passes reports whether call hands on ctx (or a context made from it).
func passes(call *ast.CallExpr, ctx types.Object, info *types.Info) bool {
	for _, a := range call.Args {
		found := false
		ast.Inspect(a, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && info.Uses[id] == ctx {
				found = true
			}
			return !found
		})
		if found {
			return true
		}
		if tv, ok := info.Types[a]; ok && tv.Type != nil && tv.Type.String() == "context.Context" {
			return true
		}
	}
	return false
}

// callees are the functions call may reach: the static one, or for an
// interface method every implementation among named in pkg.
func callees(call *ast.CallExpr, info *types.Info, named []*types.Named, pkg *types.Package) []*types.Func {
	var id *ast.Ident
	switch e := call.Fun.(type) {
	case *ast.Ident:
		id = e
	case *ast.SelectorExpr:
		id = e.Sel
		if sel, ok := info.Selections[e]; ok {
			if iface, ok := sel.Recv().Underlying().(*types.Interface); ok {
				var out []*types.Func
				for _, n := range named {
					if n.Obj().Pkg() != pkg {
						continue
					}
					for _, t := range []types.Type{n, types.NewPointer(n)} {
						if types.Implements(t, iface) {
							if m, _, _ := types.LookupFieldOrMethod(t, true, n.Obj().Pkg(), e.Sel.Name); m != nil {
								if f, ok := m.(*types.Func); ok {
									out = append(out, f)
								}
							}
							break
						}
					}
				}
				return out
			}
		}
	default:
		return nil
	}
	if f, ok := info.Uses[id].(*types.Func); ok {
		return []*types.Func{f.Origin()}
	}
	return nil
}

var _ = token.NoPos
