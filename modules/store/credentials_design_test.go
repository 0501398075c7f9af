package store_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// TestCredentialLookupDesign asserts, on the source of credentials.go, the
// design that keeps token checks free of a timing side channel:
//
//   - the only token-derived value sent to the database is SHA-256 of the
//     token, and the row is found by that digest alone (WHERE token_digest =
//     $1): a B-tree walk that stops early reveals, at most, how many leading
//     bytes of the guess's digest match a stored digest, which says nothing
//     about any token;
//   - the decision compares the stored digest with subtle.ConstantTimeCompare;
//   - no other comparison in VerifyCredential looks at token bytes: every ==
//     and != has a constant, nil or len() on one side (bytes.Equal, strings
//     functions and the like are absent).
//
// A change that looks tokens up by their text or a prefix, or compares them
// with ==, fails here.
func TestCredentialLookupDesign(t *testing.T) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, "credentials.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{} // package-level constants of the file, unquoted when strings
	var verify *ast.FuncDecl
	for _, d := range file.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			if d.Tok != token.CONST {
				continue
			}
			for _, s := range d.Specs {
				vs := s.(*ast.ValueSpec)
				for i, n := range vs.Names {
					v := ""
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							v, _ = strconv.Unquote(lit.Value)
						}
					}
					consts[n.Name] = v
				}
			}
		case *ast.FuncDecl:
			if d.Name.Name == "VerifyCredential" {
				verify = d
			}
		}
	}
	if verify == nil {
		t.Fatal("VerifyCredential not found in credentials.go")
	}

	// The query: by digest, one parameter.
	var queryConst string
	var queryArgs []ast.Expr
	digestVar := ""
	var calls []string
	ast.Inspect(verify.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if len(n.Lhs) == 1 && len(n.Rhs) == 1 {
				if c, ok := n.Rhs[0].(*ast.CallExpr); ok {
					if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "tokenDigest" {
						digestVar = n.Lhs[0].(*ast.Ident).Name
					}
				}
			}
		case *ast.CallExpr:
			switch fun := n.Fun.(type) {
			case *ast.SelectorExpr:
				if x, ok := fun.X.(*ast.Ident); ok {
					calls = append(calls, x.Name+"."+fun.Sel.Name)
				} else {
					calls = append(calls, "?."+fun.Sel.Name)
				}
				if fun.Sel.Name == "QueryContext" || fun.Sel.Name == "QueryRowContext" || fun.Sel.Name == "ExecContext" {
					if len(n.Args) >= 2 {
						if id, ok := n.Args[1].(*ast.Ident); ok {
							queryConst = id.Name
						}
						queryArgs = n.Args[2:]
					}
				}
			case *ast.Ident:
				calls = append(calls, fun.Name)
			}
		case *ast.BinaryExpr:
			if n.Op != token.EQL && n.Op != token.NEQ {
				return true
			}
			if !harmlessOperand(n.X, consts) && !harmlessOperand(n.Y, consts) {
				t.Errorf("VerifyCredential compares two variable values at %s: only constant-time compares may look at token bytes", fset.Position(n.Pos()))
			}
		}
		return true
	})
	sqlText := strings.Join(strings.Fields(consts[queryConst]), " ")
	if queryConst == "" || !strings.Contains(sqlText, "FROM credentials WHERE token_digest = $1") || strings.Contains(sqlText, "$2") {
		t.Fatalf("credential query %s = %q: want a lookup by token_digest = $1 alone", queryConst, sqlText)
	}
	if digestVar == "" || len(queryArgs) != 1 {
		t.Fatalf("query arguments %d, digest variable %q: want exactly the digest", len(queryArgs), digestVar)
	}
	if sl, ok := queryArgs[0].(*ast.SliceExpr); !ok || sl.X.(*ast.Ident).Name != digestVar {
		t.Fatalf("the query's argument is not %s[:] (the token's digest)", digestVar)
	}
	if !slices.Contains(calls, "subtle.ConstantTimeCompare") {
		t.Fatal("VerifyCredential does not decide with subtle.ConstantTimeCompare")
	}
	for _, c := range calls {
		if strings.HasPrefix(c, "bytes.") || strings.HasPrefix(c, "strings.") && c != "strings.HasPrefix" || c == "reflect.DeepEqual" {
			t.Errorf("VerifyCredential calls %s", c)
		}
	}
	// tokenDigest is SHA-256 (the stored digest is checked against
	// PostgreSQL's sha256() in TestCredentialLifecycle).
	if !strings.Contains(sourceOf(t, fset, file, "credentials.go", "tokenDigest"), "sha256.Sum256([]byte(token))") {
		t.Fatal("tokenDigest is not SHA-256 of the token")
	}
}

// harmlessOperand is a side of == / != that cannot carry token bytes: a
// literal, nil, a constant of the file, or a len() call.
func harmlessOperand(e ast.Expr, consts map[string]string) bool {
	switch e := e.(type) {
	case *ast.BasicLit:
		return true
	case *ast.Ident:
		_, isConst := consts[e.Name]
		return e.Name == "nil" || isConst
	case *ast.CallExpr:
		id, ok := e.Fun.(*ast.Ident)
		return ok && id.Name == "len"
	}
	return false
}

// sourceOf is the text of function fn in file (parsed from path).
func sourceOf(t *testing.T, fset *token.FileSet, file *ast.File, path, fn string) string {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range file.Decls {
		if f, ok := d.(*ast.FuncDecl); ok && f.Name.Name == fn {
			return string(src[fset.Position(f.Pos()).Offset:fset.Position(f.End()).Offset])
		}
	}
	t.Fatalf("%s not found", fn)
	return ""
}

// TestCredentialTimingStatistical is the measured side of the design above,
// with a bound generous enough for a busy shared machine: wrong tokens that
// share all but the last character with a live token are refused no slower
// (median, interleaved samples) than random wrong tokens, within a factor of
// 3. A lookup by token text or prefix, or an extra step for near misses,
// would show as a gap far past the noise; the digest lookup shows none.
func TestCredentialTimingStatistical(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	live, _, err := f.s.IssueCredential(ctx, "t1", "a1", "d1", store.RoleDevice)
	if err != nil {
		t.Fatal(err)
	}
	// Some more credentials so the index is not a single entry.
	for i := range 50 {
		if _, _, err := f.s.IssueCredential(ctx, "t1", "a1", "d"+strconv.Itoa(i), store.RoleDevice); err != nil {
			t.Fatal(err)
		}
	}
	// Every base64url character but the live token's last one.
	others := strings.ReplaceAll("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", live[len(live)-1:], "")
	near := func(i int) string { return live[:len(live)-1] + others[i%len(others):i%len(others)+1] }
	random := func() string {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		return store.TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	}
	measure := func(tok string) time.Duration {
		start := time.Now()
		_, err := f.s.VerifyCredential(ctx, tok)
		d := time.Since(start)
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("wrong token: %v", err)
		}
		return d
	}
	const samples = 300
	var a, b []time.Duration
	for i := range samples {
		// Interleaved, alternating which goes first, so load spikes hit both.
		if i%2 == 0 {
			a = append(a, measure(near(i)))
			b = append(b, measure(random()))
		} else {
			b = append(b, measure(random()))
			a = append(a, measure(near(i)))
		}
	}
	slices.Sort(a)
	slices.Sort(b)
	ma, mb := a[samples/2], b[samples/2]
	if ma > 3*mb || mb > 3*ma {
		t.Fatalf("median refusal time: near miss %v, random %v (more than 3x apart)", ma, mb)
	}
	t.Logf("median refusal time over %d interleaved samples: near miss %v, random %v", samples, ma, mb)
	if _, err := f.s.VerifyCredential(ctx, live); err != nil {
		t.Fatalf("live token: %v", err)
	}
}
