package envflag

import (
	"bytes"
	"errors"
	"flag"
	"log/slog"
	"strings"
	"testing"
	"time"
)

type settings struct {
	dsn, addr string
	wait      time.Duration
	n         int
	n64       int64
	u         uint64
	on        bool
	follows   Inherited
}

func newSettings() (*settings, []Setting) {
	s := &settings{addr: ":8080", wait: time.Second, n: 3}
	s.follows = Inherited{Value: Int(new(int))}
	return s, []Setting{
		Var("DATABASE_URL", "DSN", Secret(&s.dsn)),
		Var("LISTEN_ADDR", "address", String(&s.addr)),
		Var("WAIT_TIME", "wait", Duration(&s.wait)),
		Var("SOME_COUNT", "count", Int(&s.n)),
		Var("BIG_COUNT", "count", Int64(&s.n64)),
		Var("TOKENS", "tokens", Uint64(&s.u)),
		Var("TURNED_ON", "switch", Bool(&s.on)),
		Var("FOLLOWS_COUNT", "defaults to SOME_COUNT", &s.follows),
	}
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFlagName(t *testing.T) {
	for env, want := range map[string]string{"DATABASE_URL": "database-url", "JANITOR_BATCH_SIZE": "janitor-batch-size", "X": "x"} {
		if got := FlagName(env); got != want {
			t.Errorf("FlagName(%s) = %s, want %s", env, got, want)
		}
	}
}

func TestDefaultsEnvironmentAndFlags(t *testing.T) {
	s, set := newSettings()
	if err := Parse("bin", "", set, nil, envOf(nil), &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if s.addr != ":8080" || s.wait != time.Second || s.n != 3 || s.follows.Given() {
		t.Fatalf("defaults changed: %+v", s)
	}

	env := envOf(map[string]string{"DATABASE_URL": "postgres://e", "LISTEN_ADDR": ":1", "WAIT_TIME": "2m", "SOME_COUNT": "-4",
		"BIG_COUNT": "9007199254740991", "TOKENS": "18446744073709551615", "TURNED_ON": "true", "FOLLOWS_COUNT": "7"})
	s, set = newSettings()
	if err := Parse("bin", "", set, nil, env, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if s.dsn != "postgres://e" || s.addr != ":1" || s.wait != 2*time.Minute || s.n != -4 || s.n64 != 1<<53-1 ||
		s.u != 1<<64-1 || !s.on || !s.follows.Given() || s.follows.String() != "7" {
		t.Fatalf("environment not read: %+v", s)
	}

	// A flag wins over its variable; both dash forms and a bare bool work.
	s, set = newSettings()
	err := Parse("bin", "", set, []string{"--listen-addr", ":2", "-wait-time=3s", "--turned-on", "--database-url=postgres://f"}, env, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if s.addr != ":2" || s.wait != 3*time.Second || !s.on || s.dsn != "postgres://f" || s.n != -4 {
		t.Fatalf("flags did not win: %+v", s)
	}
	s, set = newSettings()
	if err := Parse("bin", "", set, []string{"--turned-on=false"}, env, &bytes.Buffer{}); err != nil || s.on {
		t.Fatalf("--turned-on=false: %v, %v", err, s.on)
	}
}

func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"duration in env", map[string]string{"WAIT_TIME": "soon"}, nil, "WAIT_TIME: not a Go duration"},
		{"int in env", map[string]string{"SOME_COUNT": "1.5"}, nil, "SOME_COUNT: not an integer"},
		{"int64 in env", map[string]string{"BIG_COUNT": "9223372036854775808"}, nil, "BIG_COUNT: not an integer"},
		{"uint64 negative", map[string]string{"TOKENS": "-1"}, nil, "TOKENS: not a non-negative integer"},
		{"bool in env", map[string]string{"TURNED_ON": "yes"}, nil, "TURNED_ON: not true or false"},
		{"inherited in env", map[string]string{"FOLLOWS_COUNT": "x"}, nil, "FOLLOWS_COUNT: not an integer"},
		{"duration flag", nil, []string{"--wait-time", "soon"}, "-wait-time: not a Go duration"},
		{"unknown flag", nil, []string{"--no-such"}, "not defined: -no-such"},
		{"stray argument", nil, []string{"run"}, `unexpected argument "run"`},
		{"flag missing its value", nil, []string{"--some-count"}, "needs an argument: -some-count"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, set := newSettings()
			err := Parse("bin", "", set, c.args, envOf(c.env), &bytes.Buffer{})
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, c.want)
			}
		})
	}
	// An inherited value refused keeps it not given.
	s, set := newSettings()
	_ = Parse("bin", "", set, nil, envOf(map[string]string{"FOLLOWS_COUNT": "x"}), &bytes.Buffer{})
	if s.follows.Given() {
		t.Fatal("a refused value counts as given")
	}
}

func TestHelpShowsDocumentedDefaultsNeverTheEnvironment(t *testing.T) {
	_, set := newSettings()
	var out bytes.Buffer
	env := envOf(map[string]string{"DATABASE_URL": "postgres://u:hunter2@h/db", "LISTEN_ADDR": ":7777", "FOLLOWS_COUNT": "9"})
	err := Parse("bin", "Does one thing.", set, []string{"-h"}, env, &out)
	if !errors.Is(err, flag.ErrHelp) || errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want flag.ErrHelp alone", err)
	}
	text := out.String()
	for _, want := range []string{"Usage: bin [flags]\nDoes one thing.\n", "-database-url", "(env DATABASE_URL)", "-wait-time",
		"(default 1s)", "(default :8080)", "(env FOLLOWS_COUNT)"} {
		if !strings.Contains(text, want) {
			t.Errorf("-h lacks %q:\n%s", want, text)
		}
	}
	for _, leak := range []string{"hunter2", ":7777", "default 9"} {
		if strings.Contains(text, leak) {
			t.Errorf("-h shows %q from the environment:\n%s", leak, text)
		}
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "FOLLOWS_COUNT") && strings.Contains(line, "(default") {
			t.Errorf("an inherited setting shows a default: %q", line)
		}
	}
}

func TestParseLogLevel(t *testing.T) {
	for s, want := range map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := ParseLogLevel(s); err != nil || got != want {
			t.Errorf("%q: %v, %v", s, got, err)
		}
	}
	// slog's own parser takes these; the setting does not.
	for _, s := range []string{"", "INFO", "warn+2", "warning", "trace", "loud"} {
		if _, err := ParseLogLevel(s); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "LOG_LEVEL must be debug, info, warn or error") {
			t.Errorf("%q: %v, want ErrInvalid naming LOG_LEVEL", s, err)
		}
	}
}
