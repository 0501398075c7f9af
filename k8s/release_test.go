package k8s

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The release checks: what CI and the release workflow build, name and publish agrees with what the
// manifests deploy, and no module's tag can point at an in-repo module no release tagged
// (docs/releasing.md). GitHub and a container registry are out of reach here; everything that can go
// wrong in the files is checked.

// modulePrefix is the import path every in-repo module's path starts with; the rest is its directory,
// and so its tag's prefix.
const modulePrefix = "github.com/envelopeworker/envelopeworker/"

// imageRefForm is how release.yml names the image it pushes: the tag is the module's version without
// its "v" (0.1.0 for services/ingest-api/v0.1.0), the form of k8s/base/kustomization.yaml's newTag. One
// rule for both is what lets a release's manifests pull what the release pushed.
const imageRefForm = "${IMAGE_PREFIX}/${name}:${VERSION#v}"

// Tools CI must run at a pinned version: @latest would make the same commit pass today and fail
// tomorrow.
var pinnedTools = []string{"honnef.co/go/tools/cmd/staticcheck", "golang.org/x/vuln/cmd/govulncheck"}

var (
	usesLine      = regexp.MustCompile(`^\s*(?:-\s+)?uses:\s*(\S+)(.*)$`)
	pinnedAction  = regexp.MustCompile(`^[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+@[0-9a-f]{40}$`)
	versionNote   = regexp.MustCompile(`^\s+# v[0-9]+\.[0-9]+\.[0-9]+\s*$`)
	goRunTool     = regexp.MustCompile(`go (?:run|install)\s+([^\s@]+)@(\S+)`)
	exactVersion  = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`)
	releaseTag    = regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
	pseudoVersion = regexp.MustCompile(`[0-9]{14}-[0-9a-f]{12}$`)
	imageTag      = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`)
	goBuild       = regexp.MustCompile(`^RUN cd (\S+) && go build .*-o (\S+) (\S+)$`)
	releaseRow    = regexp.MustCompile("^\\| `([^`]+)` \\|")
	packageMain   = regexp.MustCompile(`(?m)^package main$`)
)

// repoFiles reads repository files: from the override directory when it holds that path (a broken
// variant in testdata), else from the repository.
type repoFiles struct{ root, override string }

func (f repoFiles) read(rel string) ([]byte, error) {
	if f.override != "" {
		b, err := os.ReadFile(filepath.Join(f.override, filepath.FromSlash(rel)))
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return b, err
		}
		edit, err := os.ReadFile(filepath.Join(f.override, filepath.FromSlash(rel)+".edit"))
		if err == nil {
			real, err := os.ReadFile(filepath.Join(f.root, filepath.FromSlash(rel)))
			if err != nil {
				return nil, err
			}
			return applyEdit(real, edit)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	return os.ReadFile(filepath.Join(f.root, filepath.FromSlash(rel)))
}

// applyEdit breaks a repository file the way a broken case's FILE.edit says, so that the case
// follows the file as it changes instead of freezing a copy of it. An edit is blocks of
//
//	<<<
//	lines of the file
//	===
//	what they become (nothing: deleted)
//	>>>
//
// (lines outside blocks are comments). Every block's lines must occur in the file: an edit that no
// longer applies fails the case rather than testing an unbroken file.
func applyEdit(file, edit []byte) ([]byte, error) {
	out := string(file)
	var old, repl []string
	state := 0 // 0 outside a block, 1 in its old lines, 2 in its new lines
	for _, line := range strings.SplitAfter(string(edit), "\n") {
		switch strings.TrimRight(line, "\n") {
		case "<<<":
			state, old, repl = 1, nil, nil
			continue
		case "===":
			state = 2
			continue
		case ">>>":
			from, to := strings.Join(old, ""), strings.Join(repl, "")
			if from == "" || !strings.Contains(out, from) {
				return nil, fmt.Errorf("edit no longer applies: %q is not in the file", from)
			}
			out = strings.Replace(out, from, to, 1)
			state = 0
			continue
		}
		switch state {
		case 1:
			old = append(old, line)
		case 2:
			repl = append(repl, line)
		}
	}
	if state != 0 {
		return nil, errors.New("edit: a block is not closed with >>>")
	}
	return []byte(out), nil
}

// find lists the repository's files called name (slash paths relative to the root), leaving out test
// data, build output and version control.
func (f repoFiles) find(name string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(f.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != f.root && (d.Name() == "testdata" || d.Name() == ".git" || d.Name() == ".tmp" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && d.Name() == name {
			rel, err := filepath.Rel(f.root, p)
			if err != nil {
				return err
			}
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

type workflowStep struct {
	Name string            `json:"name"`
	Uses string            `json:"uses"`
	Run  string            `json:"run"`
	If   string            `json:"if"`
	Env  map[string]string `json:"env"`
}

type workflow struct {
	file string
	raw  []byte
	Env  map[string]string `json:"env"`
	Jobs map[string]struct {
		Uses     string `json:"uses"`
		Strategy struct {
			Matrix map[string]any `json:"matrix"`
		} `json:"strategy"`
		Steps []workflowStep `json:"steps"`
	} `json:"jobs"`
}

func readWorkflow(f repoFiles, rel string) (*workflow, error) {
	raw, err := f.read(rel)
	if err != nil {
		return nil, err
	}
	w := &workflow{file: rel, raw: raw}
	if err := yaml.Unmarshal(raw, w); err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	return w, nil
}

// checkPins: every action is pinned to a commit (a tag can be moved to other code) and says which
// release that commit is, so an update is a reviewable change of both.
func checkPins(w *workflow) []string {
	var bad []string
	for _, job := range w.Jobs {
		refs := []string{job.Uses}
		for _, s := range job.Steps {
			refs = append(refs, s.Uses)
		}
		for _, ref := range refs {
			if ref != "" && !strings.HasPrefix(ref, "./") && !pinnedAction.MatchString(ref) {
				bad = append(bad, fmt.Sprintf("%s: uses %s, not pinned to a 40-hex commit SHA", w.file, ref))
			}
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(w.raw))
	for n := 1; sc.Scan(); n++ {
		m := usesLine.FindStringSubmatch(sc.Text())
		if m == nil || strings.HasPrefix(m[1], "./") || !pinnedAction.MatchString(m[1]) {
			continue
		}
		if !versionNote.MatchString(m[2]) {
			bad = append(bad, fmt.Sprintf("%s:%d: uses %s without a # vX.Y.Z comment naming its release", w.file, n, m[1]))
		}
	}
	return bad
}

// checkTools: every tool a workflow runs by module path names an exact version, and CI runs the linters.
func checkTools(w *workflow, required []string) []string {
	var bad []string
	seen := map[string]bool{}
	for _, job := range w.Jobs {
		for _, s := range job.Steps {
			for _, m := range goRunTool.FindAllStringSubmatch(s.Run, -1) {
				if !exactVersion.MatchString(m[2]) {
					bad = append(bad, fmt.Sprintf("%s: %s@%s, not an exact version", w.file, m[1], m[2]))
					continue
				}
				seen[m[1]] = true
			}
		}
	}
	for _, t := range required {
		if !seen[t] {
			bad = append(bad, fmt.Sprintf("%s: does not run %s at a pinned version", w.file, t))
		}
	}
	return bad
}

// checkImageBuilds: CI builds every Dockerfile, so a broken one fails on the change that broke it and
// not in the middle of a release.
func checkImageBuilds(w *workflow, dockerfiles []string) []string {
	built := map[string]bool{}
	for _, job := range w.Jobs {
		if !slices.ContainsFunc(job.Steps, func(s workflowStep) bool { return strings.Contains(s.Run, "docker build") }) {
			continue
		}
		list, _ := job.Strategy.Matrix["dockerfile"].([]any)
		for _, d := range list {
			if s, ok := d.(string); ok {
				built[s] = true
			}
		}
	}
	var bad []string
	for _, d := range dockerfiles {
		if !built[d] {
			bad = append(bad, fmt.Sprintf("%s: no docker build of %s", w.file, d))
		}
		delete(built, d)
	}
	for d := range built {
		bad = append(bad, fmt.Sprintf("%s: builds %s, which does not exist", w.file, d))
	}
	slices.Sort(bad)
	return bad
}

// checkReleaseWorkflow: images are pushed under the prefix and tag form the manifests deploy, and
// before the tag that announces them.
func checkReleaseWorkflow(w *workflow) []string {
	var bad []string
	if w.Env["IMAGE_PREFIX"] == "" {
		bad = append(bad, w.file+": no workflow-level IMAGE_PREFIX")
	}
	if !bytes.Contains(w.raw, []byte(imageRefForm)) {
		bad = append(bad, fmt.Sprintf("%s: does not name its image %s", w.file, imageRefForm))
	}
	for name, job := range w.Jobs {
		image := slices.IndexFunc(job.Steps, func(s workflowStep) bool { return strings.Contains(s.Run, "docker push") })
		tag := slices.IndexFunc(job.Steps, func(s workflowStep) bool { return strings.Contains(s.Run, "git push") })
		if tag < 0 {
			continue
		}
		switch {
		case image < 0:
			bad = append(bad, fmt.Sprintf("%s: job %s tags without pushing an image", w.file, name))
		case image > tag:
			bad = append(bad, fmt.Sprintf("%s: job %s pushes the tag before the image", w.file, name))
		case job.Steps[image].If != "":
			// Which modules have an image is the Dockerfile's presence, not a condition to keep in step.
			bad = append(bad, fmt.Sprintf("%s: the image step runs only if %s", w.file, job.Steps[image].If))
		}
	}
	return bad
}

// dockerfile is what a Dockerfile builds and runs.
type dockerfile struct {
	path       string   // repository path of the Dockerfile
	module     string   // directory the build runs `go build` in
	pkg        string   // the main package, a repository path
	out        string   // go build -o
	entrypoint []string // of the final stage
	copied     map[string]string
	sources    []string // build-context COPY sources of the build stage
}

func (d dockerfile) binary() string {
	if len(d.entrypoint) == 0 {
		return ""
	}
	return path.Base(d.entrypoint[0])
}

func parseDockerfile(rel string, raw []byte) (dockerfile, error) {
	d := dockerfile{path: rel, copied: map[string]string{}}
	stages := 0
	text := strings.ReplaceAll(string(raw), "\\\n", " ")
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(line, "#") {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "FROM":
			stages++
		case "COPY":
			if len(f) >= 4 && strings.HasPrefix(f[1], "--from=") {
				d.copied[f[2]] = f[3]
			} else if len(f) >= 3 {
				d.sources = append(d.sources, f[1:len(f)-1]...)
			}
		case "RUN":
			if m := goBuild.FindStringSubmatch(line); m != nil {
				if d.out != "" {
					return d, fmt.Errorf("%s: more than one go build", rel)
				}
				d.module, d.out, d.pkg = m[1], m[2], path.Join(m[1], m[3])
			}
		case "ENTRYPOINT":
			d.entrypoint = nil
			if err := yaml.Unmarshal([]byte(strings.TrimSpace(line[len(f[0]):])), &d.entrypoint); err != nil || len(d.entrypoint) == 0 {
				return d, fmt.Errorf("%s: ENTRYPOINT is not an exec-form list: %s", rel, line)
			}
		}
	}
	if stages < 2 {
		return d, fmt.Errorf("%s: %d stages, want a build stage and the image", rel, stages)
	}
	if d.out == "" {
		return d, fmt.Errorf("%s: no `RUN cd <module> && go build ... -o <file> <package>`", rel)
	}
	return d, nil
}

// checkDockerfile: the file built is the file copied is the file run, it is the binary its image is
// named after, and every in-repo module the build resolves through a replace is in the build context.
func checkDockerfile(f repoFiles, d dockerfile, mods map[string]goMod) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, d.path+": "+fmt.Sprintf(format, a...)) }
	if path.Dir(d.path) != d.module {
		fail("builds in %s, not in its own module %s", d.module, path.Dir(d.path))
	}
	if len(d.entrypoint) == 0 {
		fail("no ENTRYPOINT")
	} else if dst, ok := d.copied[d.out]; !ok || dst != d.entrypoint[0] {
		fail("ENTRYPOINT %s is not the built %s (copied to %q)", d.entrypoint[0], d.out, dst)
	}
	if d.binary() != "" && d.binary() != path.Base(d.pkg) {
		fail("runs %s, but the package built is %s", d.binary(), d.pkg)
	}
	if ok, err := isMain(filepath.Join(f.root, filepath.FromSlash(d.pkg))); err != nil || !ok {
		fail("%s is not a main package (%v)", d.pkg, err)
	}
	mod, ok := mods[d.module]
	if !ok {
		fail("%s has no go.mod", d.module)
		return bad
	}
	need := []string{d.module}
	for _, target := range mod.replace {
		if strings.HasPrefix(target, ".") {
			need = append(need, path.Join(d.module, target))
		}
	}
	for _, dir := range need {
		if !slices.Contains(d.sources, dir+"/go.mod") {
			fail("does not copy %s/go.mod before the download", dir)
		}
		if !slices.ContainsFunc(d.sources, func(s string) bool {
			s = strings.TrimSuffix(s, "/")
			return s == dir || strings.HasPrefix(dir, s+"/")
		}) {
			fail("does not copy %s/, which the build resolves %s with", dir, d.module)
		}
	}
	return bad
}

func isMain(dir string) (bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return false, err
		}
		if packageMain.Match(b) {
			return true, nil
		}
	}
	return false, nil
}

type kustomizeImages struct {
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// checkImages: the kustomization deploys exactly the images release.yml publishes, under the same
// names and tag form.
func checkImages(prefix, rel string, k kustomizeImages, binaries map[string]dockerfile) []string {
	var bad []string
	deployed := map[string]bool{}
	for _, img := range k.Images {
		name := img.Name
		if img.NewName != "" {
			name = img.NewName
		}
		bin := strings.TrimPrefix(name, prefix+"/")
		if _, ok := binaries[bin]; !ok || bin == name {
			bad = append(bad, fmt.Sprintf("%s: image %s is not %s/<binary> of a Dockerfile", rel, name, prefix))
		}
		if !imageTag.MatchString(img.NewTag) {
			bad = append(bad, fmt.Sprintf("%s: image %s tag %q is not a release version without its v", rel, name, img.NewTag))
		}
		deployed[bin] = true
	}
	for _, bin := range sortedKeys(binaries) {
		if !deployed[bin] {
			bad = append(bad, fmt.Sprintf("%s: no images entry for %s/%s, which release.yml publishes", rel, prefix, bin))
		}
	}
	return bad
}

// checkContainers: every container runs an image some Dockerfile builds, and a command, when one is
// set, is that image's binary.
func checkContainers(prefix string, objs []object, binaries map[string]dockerfile) []string {
	var bad []string
	for _, w := range workloads(objs) {
		for _, c := range slices.Concat(w.spec.InitContainers, w.spec.Containers) {
			name, _, _ := strings.Cut(c.Image, "@")
			if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
				name = name[:i]
			}
			d, ok := binaries[strings.TrimPrefix(name, prefix+"/")]
			if !ok || !strings.HasPrefix(name, prefix+"/") {
				bad = append(bad, fmt.Sprintf("%s container %s: image %s has no Dockerfile", w.owner, c.Name, c.Image))
				continue
			}
			if len(c.Command) > 0 && c.Command[0] != d.entrypoint[0] {
				bad = append(bad, fmt.Sprintf("%s container %s: command %s is not %s, the binary %s builds", w.owner, c.Name, c.Command[0], d.entrypoint[0], d.path))
			}
		}
	}
	return bad
}

// goMod is the part of a go.mod the release order depends on.
type goMod struct {
	path    string
	require map[string]string // module path → version
	replace map[string]string // module path → target
}

func parseGoMod(raw []byte) goMod {
	m := goMod{require: map[string]string{}, replace: map[string]string{}}
	block := ""
	for line := range strings.SplitSeq(string(raw), "\n") {
		line, _, _ = strings.Cut(line, "//")
		f := strings.Fields(line)
		switch {
		case len(f) == 0:
			continue
		case f[0] == ")":
			block = ""
			continue
		case len(f) == 2 && f[1] == "(":
			block = f[0]
			continue
		case block == "":
			m.add(f[0], f[1:])
			continue
		}
		m.add(block, f)
	}
	return m
}

func (m *goMod) add(verb string, f []string) {
	switch verb {
	case "module":
		if len(f) == 1 {
			m.path = f[0]
		}
	case "require":
		if len(f) == 2 {
			m.require[f[0]] = f[1]
		}
	case "replace":
		if i := slices.Index(f, "=>"); i > 0 && i+1 < len(f) {
			m.replace[f[0]] = f[i+1]
		}
	}
}

func readGoMods(f repoFiles) (map[string]goMod, error) {
	files, err := f.find("go.mod")
	if err != nil {
		return nil, err
	}
	mods := map[string]goMod{}
	for _, rel := range files {
		raw, err := f.read(rel)
		if err != nil {
			return nil, err
		}
		mods[path.Dir(rel)] = parseGoMod(raw)
	}
	return mods, nil
}

// inRepo lists the in-repo modules a module requires, by directory.
func inRepo(m goMod) []string {
	var dirs []string
	for p := range m.require {
		if dir, ok := strings.CutPrefix(p, modulePrefix); ok {
			dirs = append(dirs, dir)
		}
	}
	slices.Sort(dirs)
	return dirs
}

// checkGoMods: a module's path is its directory (its tags' prefix), and it requires in-repo modules
// at versions a release tags, each also replaced by its directory for development.
func checkGoMods(mods map[string]goMod) []string {
	var bad []string
	for _, dir := range sortedKeys(mods) {
		m := mods[dir]
		if m.path != modulePrefix+dir {
			bad = append(bad, fmt.Sprintf("%s/go.mod: module %s, want %s (its tags are %s/vX.Y.Z)", dir, m.path, modulePrefix+dir, dir))
		}
		for _, dep := range inRepo(m) {
			p, v := modulePrefix+dep, m.require[modulePrefix+dep]
			if _, ok := mods[dep]; !ok {
				bad = append(bad, fmt.Sprintf("%s/go.mod: requires %s, no module of this repository", dir, p))
			}
			if !releaseTag.MatchString(v) || pseudoVersion.MatchString(v) {
				bad = append(bad, fmt.Sprintf("%s/go.mod: requires %s %s, a version no release tags (want the released vX.Y.Z)", dir, p, v))
			}
			if t, ok := m.replace[p]; !ok || path.Join(dir, t) != dep {
				bad = append(bad, fmt.Sprintf("%s/go.mod: requires %s without `replace %s => %s`", dir, p, p, relTo(dir, dep)))
			}
		}
	}
	return bad
}

func relTo(from, to string) string {
	r, err := filepath.Rel(filepath.FromSlash(from), filepath.FromSlash(to))
	if err != nil {
		return to
	}
	return filepath.ToSlash(r)
}

// checkReleaseOrder: docs/releasing.md's release order names every module once, each after the
// in-repo modules it requires, so following it never tags a module that requires an untagged one.
func checkReleaseOrder(rel string, doc []byte, mods map[string]goMod) []string {
	var bad []string
	_, section, ok := strings.Cut(string(doc), "\n## Release order\n")
	if !ok {
		return []string{rel + `: no "## Release order" section`}
	}
	section, _, _ = strings.Cut(section, "\n## ")
	pos := map[string]int{}
	var order []string
	for line := range strings.SplitSeq(section, "\n") {
		m := releaseRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := pos[m[1]]; dup {
			bad = append(bad, fmt.Sprintf("%s: %s listed twice", rel, m[1]))
		}
		pos[m[1]] = len(order)
		order = append(order, m[1])
	}
	for _, dir := range order {
		if _, ok := mods[dir]; !ok {
			bad = append(bad, fmt.Sprintf("%s: %s is no module", rel, dir))
		}
	}
	for _, dir := range sortedKeys(mods) {
		i, ok := pos[dir]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s: module %s missing from the release order", rel, dir))
			continue
		}
		for _, dep := range inRepo(mods[dir]) {
			if j, ok := pos[dep]; ok && j > i {
				bad = append(bad, fmt.Sprintf("%s: %s comes before %s, which it requires", rel, dir, dep))
			}
		}
	}
	return bad
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// releaseViolations runs every release check over the repository as f sees it, with objs the
// rendered manifests of each overlay.
func releaseViolations(f repoFiles, rendered [][]object) ([]string, error) {
	ci, err := readWorkflow(f, ".github/workflows/ci.yml")
	if err != nil {
		return nil, err
	}
	release, err := readWorkflow(f, ".github/workflows/release.yml")
	if err != nil {
		return nil, err
	}
	mods, err := readGoMods(f)
	if err != nil {
		return nil, err
	}
	paths, err := f.find("Dockerfile")
	if err != nil {
		return nil, err
	}
	var bad []string
	bad = append(bad, checkPins(ci)...)
	bad = append(bad, checkPins(release)...)
	bad = append(bad, checkTools(ci, pinnedTools)...)
	bad = append(bad, checkTools(release, nil)...)
	bad = append(bad, checkImageBuilds(ci, paths)...)
	bad = append(bad, checkReleaseWorkflow(release)...)

	binaries := map[string]dockerfile{}
	for _, p := range paths {
		raw, err := f.read(p)
		if err != nil {
			return nil, err
		}
		d, err := parseDockerfile(p, raw)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		bad = append(bad, checkDockerfile(f, d, mods)...)
		if other, dup := binaries[d.binary()]; dup {
			bad = append(bad, fmt.Sprintf("%s and %s both build the image %s", other.path, p, d.binary()))
		}
		binaries[d.binary()] = d
	}

	const kustomization = "k8s/base/kustomization.yaml"
	raw, err := f.read(kustomization)
	if err != nil {
		return nil, err
	}
	var k kustomizeImages
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", kustomization, err)
	}
	prefix := release.Env["IMAGE_PREFIX"]
	bad = append(bad, checkImages(prefix, kustomization, k, binaries)...)
	for _, objs := range rendered {
		bad = append(bad, checkContainers(prefix, objs, binaries)...)
	}

	bad = append(bad, checkGoMods(mods)...)
	const doc = "docs/releasing.md"
	raw, err = f.read(doc)
	if err != nil {
		return nil, err
	}
	bad = append(bad, checkReleaseOrder(doc, raw, mods)...)
	return bad, nil
}

func renderAll(dirs ...string) ([][]object, error) {
	var out [][]object
	for _, d := range dirs {
		objs, err := render(d)
		if err != nil {
			return nil, err
		}
		out = append(out, objs)
	}
	return out, nil
}

func TestReleaseFilesAgree(t *testing.T) {
	dirs, err := overlayDirs()
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := renderAll(append([]string{"base"}, dirs...)...)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := releaseViolations(repoFiles{root: ".."}, rendered)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range bad {
		t.Error(v)
	}
}

// Each case under testdata/release replaces one or two repository files (same relative path) with a
// broken variant, or renders a broken kustomization; the checks must name exactly what is wrong.
func TestBrokenReleaseFails(t *testing.T) {
	cases := []struct {
		dir    string
		render string // kustomization to render instead of base
		want   []string
	}{
		{"action-by-tag", "", []string{
			".github/workflows/ci.yml: uses actions/setup-go@v5, not pinned to a 40-hex commit SHA",
		}},
		{"sha-without-release", "", []string{
			".github/workflows/release.yml:42: uses actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683 without a # vX.Y.Z comment",
		}},
		{"tool-at-latest", "", []string{
			".github/workflows/ci.yml: golang.org/x/vuln/cmd/govulncheck@latest, not an exact version",
			".github/workflows/ci.yml: does not run golang.org/x/vuln/cmd/govulncheck at a pinned version",
		}},
		{"dockerfile-not-built", "", []string{
			".github/workflows/ci.yml: no docker build of tools/Dockerfile",
			".github/workflows/ci.yml: builds tools/envctl/Dockerfile, which does not exist",
		}},
		{"tag-before-image", "", []string{
			".github/workflows/release.yml: job release pushes the tag before the image",
		}},
		{"image-for-services-only", "", []string{
			".github/workflows/release.yml: the image step runs only if startsWith(inputs.module, 'services/')",
		}},
		{"tag-with-v", "", []string{
			`.github/workflows/release.yml: does not name its image ${IMAGE_PREFIX}/${name}:${VERSION#v}`,
			`k8s/base/kustomization.yaml: image envelopeworker/envctl tag "v0.1.0" is not a release version without its v`,
		}},
		{"other-prefix", "", []string{
			"k8s/base/kustomization.yaml: image envelopeworker/ingest-api is not envelope-worker/<binary> of a Dockerfile",
			"k8s/base/kustomization.yaml: image envelopeworker/delivery-worker is not envelope-worker/<binary> of a Dockerfile",
			"k8s/base/kustomization.yaml: image envelopeworker/retention-janitor is not envelope-worker/<binary> of a Dockerfile",
			"k8s/base/kustomization.yaml: image envelopeworker/envctl is not envelope-worker/<binary> of a Dockerfile",
			"k8s/base/kustomization.yaml: no images entry for envelope-worker/delivery-worker, which release.yml publishes",
			"k8s/base/kustomization.yaml: no images entry for envelope-worker/envctl, which release.yml publishes",
			"k8s/base/kustomization.yaml: no images entry for envelope-worker/ingest-api, which release.yml publishes",
			"k8s/base/kustomization.yaml: no images entry for envelope-worker/retention-janitor, which release.yml publishes",
			"Deployment/envelopeworker-ingest-api container ingest-api: image envelopeworker/ingest-api:0.1.0 has no Dockerfile",
			"Deployment/envelopeworker-delivery-worker container delivery-worker: image envelopeworker/delivery-worker:0.1.0 has no Dockerfile",
			"CronJob/envelopeworker-retention-janitor container retention-janitor: image envelopeworker/retention-janitor:0.1.0 has no Dockerfile",
			"Job/envelopeworker-migrate-v0-1-0 container migrate: image envelopeworker/envctl:0.1.0 has no Dockerfile",
			"CronJob/envelopeworker-analyze container analyze: image envelopeworker/envctl:0.1.0 has no Dockerfile",
		}},
		{"entrypoint-renamed", "", []string{
			"services/ingest-api/Dockerfile: ENTRYPOINT /ingest is not the built /out/ingest-api",
			"services/ingest-api/Dockerfile: runs ingest, but the package built is services/ingest-api",
			"k8s/base/kustomization.yaml: image envelopeworker/ingest-api is not envelopeworker/<binary> of a Dockerfile",
			"k8s/base/kustomization.yaml: no images entry for envelopeworker/ingest, which release.yml publishes",
			"Deployment/envelopeworker-ingest-api container ingest-api: image envelopeworker/ingest-api:0.1.0 has no Dockerfile",
		}},
		{"module-source-missing", "", []string{
			"services/retention-janitor/Dockerfile: does not copy modules/buildinfo/, which the build resolves services/retention-janitor with",
		}},
		{"pseudo-version", "", []string{
			"services/ingest-api/go.mod: requires github.com/envelopeworker/envelopeworker/modules/store v0.0.0-00010101000000-000000000000, a version no release tags",
			"services/ingest-api/go.mod: requires github.com/envelopeworker/envelopeworker/modules/limiter without `replace github.com/envelopeworker/envelopeworker/modules/limiter => ../../modules/limiter`",
		}},
		{"release-order", "", []string{
			"docs/releasing.md: modules/producer comes before modules/envelope, which it requires",
			"docs/releasing.md: module tools missing from the release order",
		}},
		{"", "testdata/release/command-mismatch", []string{
			"Job/envelopeworker-migrate-v0-1-0 container migrate: command /migrate is not /envctl, the binary tools/Dockerfile builds",
			"Deployment/envelopeworker-ingest-api container ingest-api: image envelopeworker/webhook-sink:0.1.0 has no Dockerfile",
		}},
	}
	for _, tc := range cases {
		name := tc.dir
		if name == "" {
			name = filepath.Base(tc.render)
		}
		t.Run(name, func(t *testing.T) {
			f := repoFiles{root: ".."}
			if tc.dir != "" {
				f.override = filepath.Join("testdata", "release", tc.dir)
				if _, err := os.Stat(f.override); err != nil {
					t.Fatal(err)
				}
			}
			dir := "base"
			if tc.render != "" {
				dir = tc.render
			}
			rendered, err := renderAll(dir)
			if err != nil {
				t.Fatal(err)
			}
			vs, err := releaseViolations(f, rendered)
			if err != nil {
				t.Fatal(err)
			}
			wantViolations(t, vs, tc.want)
		})
	}
}

func TestParseGoMod(t *testing.T) {
	m := parseGoMod([]byte("module example.com/a // the module\n\ngo 1.26\n\nrequire example.com/b v1.2.3\n" +
		"require (\n\texample.com/c v0.1.0 // indirect\n)\n" +
		"replace example.com/b => ../b\nreplace (\n\texample.com/c v0.1.0 => ./c\n)\n"))
	if m.path != "example.com/a" || m.require["example.com/b"] != "v1.2.3" || m.require["example.com/c"] != "v0.1.0" ||
		m.replace["example.com/b"] != "../b" || m.replace["example.com/c"] != "./c" || len(m.require) != 2 || len(m.replace) != 2 {
		t.Fatalf("parsed %+v", m)
	}
}

// A broken case's edit applies in order, and one that no longer matches its file is an error, not a
// case that quietly tests an unbroken file.
func TestApplyEdit(t *testing.T) {
	file := []byte("a\nb\nc\n")
	got, err := applyEdit(file, []byte("comment\n<<<\nb\n===\nB\nB2\n>>>\n<<<\nc\n===\n>>>\n"))
	if err != nil || string(got) != "a\nB\nB2\n" {
		t.Fatalf("applyEdit = %q, %v", got, err)
	}
	if _, err := applyEdit(file, []byte("<<<\nx\n===\ny\n>>>\n")); err == nil {
		t.Fatal("an edit whose lines are not in the file applied")
	}
	if _, err := applyEdit(file, []byte("<<<\na\n===\n")); err == nil {
		t.Fatal("an unclosed edit applied")
	}
}
