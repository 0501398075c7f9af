package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// The OpenAPI document of the API, in the service module's root.
const openAPIPath = "../../openapi.yaml"

type apiDoc struct {
	doc    *openapi3.T
	router routers.Router

	mu sync.Mutex
	// seen is every "METHOD path status" the server answered and the
	// document validated.
	seen map[string]bool
}

// loadAPIDoc loads and validates the document as OpenAPI 3.1.
func loadAPIDoc(t testing.TB) *apiDoc {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(openAPIPath)
	if err != nil {
		t.Fatalf("load %s: %v", openAPIPath, err)
	}
	if !doc.IsOpenAPI31OrLater() {
		t.Fatalf("the document is OpenAPI %s, want 3.1", doc.OpenAPI)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the document is not valid OpenAPI: %v", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &apiDoc{doc: doc, router: router, seen: map[string]bool{}}
}

// validate checks one real answer against the document (see check).
func (d *apiDoc) validate(t testing.TB, hr *http.Request, r resp) {
	t.Helper()
	if err := d.check(hr, r); err != nil {
		t.Fatal(err)
	}
}

// check holds one real answer to the document: its status is one the
// operation lists, its headers (X-Correlation-Id, Retry-After) and its body
// match that response, and it is application/json. An answer to a path or
// method no operation has must be the routing refusal.
func (d *apiDoc) check(hr *http.Request, r resp) error {
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		return fmt.Errorf("%s %s: %d with Content-Type %q", hr.Method, hr.URL, r.status, ct)
	}
	route, params, err := d.router.FindRoute(hr)
	if errors.Is(err, routers.ErrPathNotFound) || errors.Is(err, routers.ErrMethodNotAllowed) {
		want := http.StatusNotFound
		if errors.Is(err, routers.ErrMethodNotAllowed) {
			want = http.StatusMethodNotAllowed
		}
		var body any
		if r.status != want || r.header.Get("X-Correlation-Id") == "" || json.Unmarshal(r.body, &body) != nil {
			return fmt.Errorf("%s %s is not in the document, answered %d %s", hr.Method, hr.URL, r.status, r.body)
		}
		if err := d.doc.Components.Schemas["Refusal"].Value.VisitJSON(body, openapi3.EnableJSONSchema2020()); err != nil {
			return fmt.Errorf("%s %s: routing refusal %s: %w", hr.Method, hr.URL, r.body, err)
		}
		d.note("ROUTING", strconv.Itoa(r.status))
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", hr.Method, hr.URL, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: hr, PathParams: params, Route: route},
		Status:                 r.status,
		Header:                 r.header,
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	in.SetBodyBytes(r.body)
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		return fmt.Errorf("%s %s: answer %d %.600s does not match the document: %w", hr.Method, hr.URL, r.status, r.body, err)
	}
	d.note(route.Method+" "+route.Path, strconv.Itoa(r.status))
	return nil
}

func (d *apiDoc) note(op, status string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen[op+" "+status] = true
}

// normalizedPath writes every path parameter as {} (echo's :name, the
// document's {name}), so the two spellings of a route compare equal.
func normalizedPath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if strings.HasPrefix(s, ":") || (strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}")) {
			segs[i] = "{}"
		}
	}
	return strings.Join(segs, "/")
}

// TestOpenAPIRoutesAreTheRouters: the document lists exactly the routes
// echo registers, no more and no fewer.
func TestOpenAPIRoutesAreTheRouters(t *testing.T) {
	d := loadAPIDoc(t)
	f := newFixture(t)
	var fromEcho, fromDoc []string
	for _, r := range f.srv.echo.Routes() {
		fromEcho = append(fromEcho, r.Method+" "+normalizedPath(r.Path))
	}
	for path, item := range d.doc.Paths.Map() {
		for method := range item.Operations() {
			fromDoc = append(fromDoc, method+" "+normalizedPath(path))
		}
	}
	slices.Sort(fromEcho)
	slices.Sort(fromDoc)
	if !slices.Equal(slices.Compact(fromEcho), fromDoc) {
		t.Fatalf("router and document differ:\nrouter:   %v\ndocument: %v", fromEcho, fromDoc)
	}
}

// goReasons is every refusal code the code defines: the wire package's
// Reason constants and this package's own reason constants with a literal
// value (the outbox's). Read from the source, so a new code cannot be
// added without the document's enum following.
func goReasons(t *testing.T) []string {
	t.Helper()
	var out []string
	collect := func(file string, want func(*ast.ValueSpec, *ast.Ident) bool) {
		af, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range af.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i >= len(vs.Values) || !want(vs, name) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						v, err := strconv.Unquote(lit.Value)
						if err != nil {
							t.Fatal(err)
						}
						out = append(out, v)
					}
				}
			}
		}
	}
	wireFiles, err := filepath.Glob("../../../../modules/producer/wire/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range wireFiles {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		collect(file, func(vs *ast.ValueSpec, _ *ast.Ident) bool {
			typ, ok := vs.Type.(*ast.Ident)
			return ok && typ.Name == "Reason"
		})
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		collect(file, func(_ *ast.ValueSpec, name *ast.Ident) bool { return strings.HasPrefix(name.Name, "reason") })
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestOpenAPIReasonsAreTheCodes: the document's Reason enum is the list of
// codes the Go code defines, and each has the status the document gives it.
func TestOpenAPIReasonsAreTheCodes(t *testing.T) {
	d := loadAPIDoc(t)
	var enum []string
	for _, v := range d.doc.Components.Schemas["Reason"].Value.Enum {
		enum = append(enum, v.(string))
	}
	slices.Sort(enum)
	if got := goReasons(t); !slices.Equal(got, enum) {
		t.Fatalf("Reason enum %v, the code defines %v", enum, got)
	}
}

// TestOpenAPIValidatesRealAnswers drives the real server, over a real
// database, through every kind of answer (accepted, duplicate, each
// refusal, both batch routes, the outbox, dead letters, replay, attempts,
// stream reads, outbound keys, health, a failing database) and validates
// each answer against the document.
func TestOpenAPIValidatesRealAnswers(t *testing.T) {
	d := loadAPIDoc(t)
	o := newOutboxFixture(t)
	f := o.fixture
	f.observe = func(hr *http.Request, r resp) { d.validate(t, hr, r) }
	ctx := context.Background()

	f.get("", "/healthz")
	f.get("", "/readyz")
	for _, c := range refusalScenario(t, o) {
		if r := c.do(); r.status != c.status {
			t.Fatalf("%s: %d, want %d: %s", c.name, r.status, c.status, r.body)
		}
	}
	checkBatchItemDetails(t, o)
	wantAnswer(t, f.post(f.device, f.sign(draft(1))), 200, "duplicate", "", -1)

	// The outbox: created, repeated, repeated after expiry, batch, status,
	// attempts (none and some), dead letters, replay.
	created, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-dead", "")), http.StatusCreated, o.pub)
	o.enqueued(o.postOutbox(o.service, outboxBody("k-dead", "")), http.StatusOK, o.pub)
	if r := o.postOutbox(o.service, outboxBody("k-expired", "")); r.status != http.StatusOK || !strings.Contains(string(r.body), `"payload_expired":true`) {
		t.Fatalf("repeat after expiry: %d %s", r.status, r.body)
	}
	o.batchResults(o.postOutboxBatch(o.service, outboxBatchBody(outboxBody("k-dead", ""), outboxBody("k-expired", ""), outboxBody("k-new", ""))))
	o.status(o.service, created.MessageIDs[0])
	if r := f.get(f.operator, "/v1/outbox/"+created.MessageIDs[0]+"/attempts"); r.status != http.StatusOK || string(r.body) != `{"attempts":[]}` {
		t.Fatalf("attempts before any: %d %s", r.status, r.body)
	}
	kill(t, f, tenantA, created.MessageIDs...)
	if r := f.get(f.service, "/v1/outbox/"+created.MessageIDs[0]+"/attempts"); r.status != http.StatusOK || !strings.Contains(string(r.body), `"result":"dead"`) {
		t.Fatalf("attempts after a dead one: %d %s", r.status, r.body)
	}
	if p := o.deadLetters(o.operator, "project_id=proj-1&limit=1"); p.NextAfter == nil {
		t.Fatalf("first page of several: %+v", p)
	}
	o.deadLetters(o.operator, "project_id=proj-1")
	if r := f.do(req{method: http.MethodPost, path: "/v1/dead-letters/" + created.MessageIDs[0] + "/replay", token: f.operator}); r.status != http.StatusOK {
		t.Fatalf("replay: %d %s", r.status, r.body)
	}

	// Stream reads and outbound keys.
	if r := f.get(f.device, "/v1/streams/proj-1/device-7"); r.status != http.StatusOK {
		t.Fatalf("stream state: %d %s", r.status, r.body)
	}
	// One payload past its (test: century-long) retention, so the page
	// holds an expired entry too.
	if n, err := f.st.Retention().DeleteExpiredPayloads(ctx, time.Now().AddDate(101, 0, 0), 1); err != nil || n != 1 {
		t.Fatalf("expiring one payload: %v %v", n, err)
	}
	if r := f.get(f.service, "/v1/streams/proj-1/device-7/envelopes?after=0&limit=100"); r.status != http.StatusOK ||
		!strings.Contains(string(r.body), `"envelope":null`) || !strings.Contains(string(r.body), `"envelope":{`) {
		t.Fatalf("stream page: %d %s", r.status, r.body)
	}
	if r := f.get(f.operator, "/v1/outbound-keys"); r.status != http.StatusOK || !strings.Contains(string(r.body), `"current":true`) {
		t.Fatalf("outbound keys: %d %s", r.status, r.body)
	}

	// The limiters.
	lim := newLimitedFixture(t)
	lim.observe = f.observe
	checkLimiterDetails(t, lim)

	// Every operation: without a credential (401), out of peer tokens
	// (429), and, for those with a body, over the body limit (413).
	tooLarge := make([]byte, envelope.MaxDocumentBytes+1)
	for i, op := range d.operations() {
		host := fmt.Sprintf("198.51.100.%d:1", 1+i)
		if op.respond("401") {
			lim.do(req{method: op.method, path: op.concrete, remote: host})
		}
		if op.respond("413") {
			lim.do(req{method: op.method, path: op.concrete, remote: host, token: lim.service, body: tooLarge})
		}
		if op.respond("429") {
			for range 4 {
				lim.do(req{method: op.method, path: op.concrete, remote: host, token: lim.operator})
			}
		}
	}

	// A database that does not answer: 503 on every route that needs it.
	down, err := store.Open(ctx, "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	f.srv = f.newServer(testConfig(), down)
	for _, op := range d.operations() {
		if !op.respond("503") {
			continue
		}
		var body []byte
		if op.method == http.MethodPost {
			body = []byte(`{}`)
		}
		if r := f.do(req{method: op.method, path: op.concrete, token: f.operator, body: body}); r.status != http.StatusServiceUnavailable {
			t.Fatalf("%s %s with the database down: %d %s", op.method, op.concrete, r.status, r.body)
		}
	}

	// Every answer the document lists was produced and validated, but for
	// a handler fault (500), which no request can cause.
	var missing []string
	for _, op := range d.operations() {
		for _, status := range op.statuses {
			if key := op.method + " " + op.path + " " + status; !d.seen[key] && status != "500" {
				missing = append(missing, key)
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("documented answers never produced: %v", missing)
	}
	for _, routing := range []string{"ROUTING 404", "ROUTING 405"} {
		if !d.seen[routing] {
			t.Fatalf("no %s answer validated", routing)
		}
	}
}

// apiOperation is one operation of the document with a concrete path to
// call it on.
type apiOperation struct {
	method, path, concrete string
	statuses               []string
}

func (o apiOperation) respond(status string) bool { return slices.Contains(o.statuses, status) }

// operations lists the document's operations in a stable order.
func (d *apiDoc) operations() []apiOperation {
	var out []apiOperation
	params := strings.NewReplacer("{project_id}", projectA, "{producer_id}", deviceA, "{message_id}", "msg_000000000000000000000000")
	for path, item := range d.doc.Paths.Map() {
		for method, op := range item.Operations() {
			a := apiOperation{method: method, path: path, concrete: params.Replace(path)}
			if path == "/v1/dead-letters" {
				a.concrete += "?project_id=" + projectA
			}
			for status := range op.Responses.Map() {
				a.statuses = append(a.statuses, status)
			}
			slices.Sort(a.statuses)
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b apiOperation) int { return strings.Compare(a.method+a.path, b.method+b.path) })
	return out
}

// TestOpenAPIRefusesWrongAnswers: the validation above is real: answers
// that break the document in one way each are caught.
func TestOpenAPIRefusesWrongAnswers(t *testing.T) {
	d := loadAPIDoc(t)
	f := newFixture(t)
	var hr *http.Request
	var good resp
	f.observe = func(r *http.Request, a resp) { hr, good = r, a }
	f.post(f.service, f.sign(draft(1))) // 403 forbidden
	if err := d.check(hr, good); err != nil {
		t.Fatalf("the real answer: %v", err)
	}
	variant := func(edit func(*resp)) resp {
		r := resp{status: good.status, header: good.header.Clone(), body: slices.Clone(good.body)}
		edit(&r)
		return r
	}
	for name, r := range map[string]resp{
		"unknown member":    variant(func(r *resp) { r.body = []byte(strings.Replace(string(r.body), `{`, `{"x":1,`, 1)) }),
		"unknown reason":    variant(func(r *resp) { r.body = []byte(strings.Replace(string(r.body), `"forbidden"`, `"made_up"`, 1)) }),
		"no correlation id": variant(func(r *resp) { r.header.Del("X-Correlation-Id") }),
		"undocumented code": variant(func(r *resp) { r.status = http.StatusTeapot }),
		"not json":          variant(func(r *resp) { r.header.Set("Content-Type", "text/plain") }),
		"empty detail": variant(func(r *resp) {
			r.body = []byte(strings.Replace(string(r.body), `"detail":"`+detailRoleDevice+`"`, `"detail":""`, 1))
		}),
		"429 without header": variant(func(r *resp) { r.status = http.StatusTooManyRequests }),
		"accepted as 403":    variant(func(r *resp) { r.body = []byte(strings.Replace(string(r.body), `"refused"`, `"accepted"`, 1)) }),
	} {
		if err := d.check(hr, r); err == nil {
			t.Errorf("%s: %d %s passed", name, r.status, r.body)
		}
	}
}
