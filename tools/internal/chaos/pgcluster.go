package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrNoServerBinaries reports a machine without PostgreSQL's server binaries (initdb, pg_ctl).
var ErrNoServerBinaries = errors.New("chaos: no PostgreSQL server binaries (initdb, pg_ctl) found: " +
	"install the postgresql package, or put its bin directory on PATH or in PG_BINDIR")

// Cluster is a throwaway PostgreSQL cluster of this run: its own data directory and a free loopback
// port, never the shared server on 5432. It is the only server the chaos run restarts.
type Cluster struct {
	bindir string
	dir    string // owned by the cluster's OS user
	Port   int
	cred   *syscall.Credential // nil: run as ourselves
}

// FindBinDir locates initdb and pg_ctl: PG_BINDIR, `pg_config --bindir`, the newest
// /usr/lib/postgresql/*/bin (Debian keeps them off PATH), then PATH.
func FindBinDir(ctx context.Context) (string, error) {
	ok := func(d string) bool {
		for _, b := range []string{"initdb", "pg_ctl", "postgres"} {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("PG_BINDIR"); d != "" && ok(d) {
		return d, nil
	}
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); ok(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if ok(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && ok(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", ErrNoServerBinaries
}

func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// owner picks the OS user the cluster runs as: ourselves, or (PostgreSQL refuses to run as root)
// postgres, else nobody.
func owner() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("chaos: running as root and neither user postgres nor nobody exists")
}

// StartCluster runs initdb into a new temporary directory and starts the server on a free loopback
// port with trust authentication. fsync is off (the machine does not crash, processes do: a killed
// server's WAL is in the page cache); synchronous_commit stays on, so an acknowledged commit survives
// an immediate shutdown.
func StartCluster(ctx context.Context) (*Cluster, error) {
	bindir, err := FindBinDir(ctx)
	if err != nil {
		return nil, err
	}
	cred, err := owner()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "envelopeworker-chaos-pg-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	c := &Cluster{bindir: bindir, dir: dir, cred: cred}
	if err := os.Chmod(dir, 0o755); err != nil {
		c.remove()
		return nil, fmt.Errorf("chmod %s: %w", dir, err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			c.remove()
			return nil, fmt.Errorf("chown %s: %w", dir, err)
		}
	}
	if err := c.run(ctx, "initdb", "-D", c.data(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync"); err != nil {
		c.remove()
		return nil, err
	}
	if c.Port, err = freePort(); err != nil {
		c.remove()
		return nil, err
	}
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
max_connections = 200
fsync = off
full_page_writes = off
synchronous_commit = on
log_min_messages = warning
`, c.Port, dir)
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		c.remove()
		return nil, fmt.Errorf("write postgresql.conf: %w", err)
	}
	if err := c.pgctl(ctx, "start", "-l", filepath.Join(dir, "server.log")); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// DSN is the superuser DSN of database db.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// Addr is the server's host:port.
func (c *Cluster) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.Port)) }

func (c *Cluster) run(ctx context.Context, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, bin), args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", bin, strings.Join(args, " "), err, out.String())
	}
	return nil
}

func (c *Cluster) pgctl(ctx context.Context, action string, extra ...string) error {
	args := append([]string{action, "-D", c.data(), "-w", "-t", "60"}, extra...)
	return c.run(ctx, "pg_ctl", args...)
}

// Restart stops the server in mode ("fast": disconnect every session, checkpoint; "immediate": kill
// every process without a checkpoint, so the next start runs crash recovery) and starts it again on
// the same port.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if mode != "fast" && mode != "immediate" {
		return fmt.Errorf("chaos: restart mode %q", mode)
	}
	if err := c.pgctl(ctx, "stop", "-m", mode); err != nil {
		return err
	}
	return c.pgctl(ctx, "start", "-l", filepath.Join(c.dir, "server.log"))
}

// Stop stops the server (fast) and removes its directory.
func (c *Cluster) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	err := c.pgctl(ctx, "stop", "-m", "fast")
	c.remove()
	return err
}

func (c *Cluster) remove() { _ = os.RemoveAll(c.dir) }
