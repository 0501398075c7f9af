package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Binaries are the service binaries under test, built once per run.
type Binaries struct {
	Ingest, Worker string
}

// Build compiles ingest-api and delivery-worker from the repository at root into dir.
func Build(ctx context.Context, root, dir string) (Binaries, error) {
	b := Binaries{Ingest: filepath.Join(dir, "ingest-api"), Worker: filepath.Join(dir, "delivery-worker")}
	for _, x := range []struct{ pkg, out string }{
		{"services/ingest-api", b.Ingest}, {"services/delivery-worker", b.Worker},
	} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", x.out, ".")
		cmd.Dir = filepath.Join(root, filepath.FromSlash(x.pkg))
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("go build %s: %w\n%s", x.pkg, err, out)
		}
	}
	return b, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// Replica is one process of a binary, restartable on the same addresses.
type Replica struct {
	Name     string
	bin      string
	env      []string
	readyURL string // polled after each start
	logs     *tailBuffer
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	exitErr  error

	metricsURL string // scraped before each kill and stop, when set
	counters   map[string]float64
}

// watched are the counters a scrape adds up over a replica's lives (a killed process loses its own).
var watched = map[string]string{
	`envelopeworker_delivery_fenced_settles_total`: "fenced_settles",
	`envelopeworker_delivery_lease_expiries_total`: "lease_expiries_seen",
}

// scrape adds the watched counters of the running process to the replica's totals (best effort).
func (r *Replica) scrape() {
	if r.metricsURL == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.metricsURL, nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counters == nil {
		r.counters = map[string]float64{}
	}
	for _, line := range strings.Split(string(body), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		key, ok := watched[name]
		if strings.HasPrefix(name, "envelopeworker_delivery_attempts_total{") && strings.Contains(name, `result="lease_lost"`) {
			key, ok = "lease_lost_attempts", true
		}
		if ok {
			if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
				r.counters[key] += v
			}
		}
	}
}

// Counters are the watched counters summed over every scrape.
func (r *Replica) Counters() map[string]float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]float64{}
	for k, v := range r.counters {
		out[k] = v
	}
	return out
}

func newReplica(name, bin string, env []string, readyURL string) *Replica {
	return &Replica{Name: name, bin: bin, env: env, readyURL: readyURL, logs: &tailBuffer{max: 64 << 10}}
}

// Start runs the process and waits until its readiness URL answers 200 (or within passes).
func (r *Replica) Start(ctx context.Context, within time.Duration) error {
	r.mu.Lock()
	cmd := exec.Command(r.bin)
	cmd.Env = append(os.Environ(), r.env...)
	cmd.Stdout, cmd.Stderr = r.logs, r.logs
	// Should the test process die, its replicas die with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		r.mu.Unlock()
		return fmt.Errorf("start %s: %w", r.Name, err)
	}
	exited := make(chan struct{})
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()
	go func() {
		err := cmd.Wait()
		r.mu.Lock()
		r.exitErr = err
		r.mu.Unlock()
		close(exited)
	}()
	return r.waitReady(ctx, within, exited)
}

func (r *Replica) waitReady(ctx context.Context, within time.Duration, exited chan struct{}) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		select {
		case <-exited:
			return fmt.Errorf("%s exited during start-up: %v\n%s", r.Name, r.exitError(), r.logs.String())
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.readyURL, nil)
		if err != nil {
			return fmt.Errorf("readiness request: %w", err)
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready after %v\n%s", r.Name, within, r.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *Replica) exitError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.exitErr
}

// Kill sends SIGKILL and waits for the process to be gone.
func (r *Replica) Kill() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	if r.Running() {
		r.scrape()
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// Running reports whether the last started process is still alive; an exit nobody asked for is
// remembered for the report.
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exited == nil {
		return false
	}
	select {
	case <-r.exited:
		return false
	default:
		return true
	}
}

// Stop sends SIGTERM and waits up to grace, then SIGKILLs. It reports an exit that was not clean.
func (r *Replica) Stop(grace time.Duration) error {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-exited:
		return fmt.Errorf("%s had exited before the stop: %v", r.Name, r.exitError())
	default:
	}
	r.scrape()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s ignored SIGTERM for %v", r.Name, grace)
	}
	if err := r.exitError(); err != nil {
		return fmt.Errorf("%s exited with %w on SIGTERM", r.Name, err)
	}
	return nil
}

// Logs is the tail of the replica's output over all its starts.
func (r *Replica) Logs() string { return r.logs.String() }
