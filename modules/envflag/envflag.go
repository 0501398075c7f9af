// Package envflag reads a binary's settings the way the contract names them
// (§6, §7.9): every setting is an environment variable FOO_BAR mirrored by
// the flag --foo-bar, a flag given on the command line wins over the
// environment, and -h lists them all with their documented defaults.
//
// The binaries' config packages own their settings, defaults and range
// checks; this package owns only the mechanics and the value types, so the
// three services parse alike.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid reports a setting that cannot be used; the message names it.
var ErrInvalid = errors.New("invalid configuration")

// Setting is one variable: its environment name, its help line and where
// its value goes. Value holds the default when Parse is called.
type Setting struct {
	Env   string
	Help  string
	Value flag.Value
}

// Var is the Setting of the variable env.
func Var(env, help string, v flag.Value) Setting { return Setting{Env: env, Help: help, Value: v} }

// FlagName is the flag of an environment variable: FOO_BAR is foo-bar.
func FlagName(env string) string { return strings.ReplaceAll(strings.ToLower(env), "_", "-") }

// Parse sets settings from getenv, then from args (without the program
// name). -h prints usage to out (name, about when not empty, every setting
// with its default) and returns flag.ErrHelp unwrapped. Any other failure
// wraps ErrInvalid and names the variable or the flag.
//
// Flags are registered before the environment is read, so -h shows the
// documented defaults and never a value from the environment (a
// DATABASE_URL can hold a password).
func Parse(name, about string, settings []Setting, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	for _, s := range settings {
		fs.Var(s.Value, FlagName(s.Env), s.Help+" (env "+s.Env+")")
	}
	fs.Usage = func() {
		fmt.Fprintf(out, "Usage: %s [flags]\n", name)
		if about != "" {
			fmt.Fprintln(out, about)
		}
		fmt.Fprintln(out, "Every flag --foo-bar may instead be set by the environment variable FOO_BAR; a flag wins.")
		fs.PrintDefaults()
	}
	for _, s := range settings {
		if v := getenv(s.Env); v != "" {
			if err := s.Value.Set(v); err != nil {
				return fmt.Errorf("%w: %s: %v", ErrInvalid, s.Env, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", ErrInvalid, fs.Arg(0))
	}
	return nil
}

// LogLevelHelp is the help line of LOG_LEVEL, which every binary has.
const LogLevelHelp = "debug, info, warn or error"

// ParseLogLevel is LOG_LEVEL's rule: exactly debug, info, warn or error
// (slog would also take "INFO" or "warn+2"), as the slog level the logger
// is built with. The error wraps ErrInvalid.
func ParseLogLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%w: LOG_LEVEL must be debug, info, warn or error", ErrInvalid)
}

// String is a text setting.
func String(p *string) flag.Value { return (*stringValue)(p) }

// Secret is a text setting -h never shows a value of.
func Secret(p *string) flag.Value { return (*secretValue)(p) }

// Duration is a Go duration ("90s", "2160h").
func Duration(p *time.Duration) flag.Value { return (*durationValue)(p) }

// Int is a decimal int.
func Int(p *int) flag.Value { return (*intValue)(p) }

// Int64 is a decimal int64.
func Int64(p *int64) flag.Value { return (*int64Value)(p) }

// Uint64 is a non-negative decimal uint64.
func Uint64(p *uint64) flag.Value { return (*uint64Value)(p) }

// Bool is true or false (strconv.ParseBool); the bare flag means true.
func Bool(p *bool) flag.Value { return (*boolValue)(p) }

// Inherited wraps a setting whose default is another setting's value: -h
// shows no default of its own, and Given tells the caller whether to
// inherit.
type Inherited struct {
	flag.Value
	given bool
}

// Given reports whether the environment or a flag set the value.
func (v *Inherited) Given() bool { return v.given }

// Set sets the wrapped value and records that it was given.
func (v *Inherited) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return err
	}
	v.given = true
	return nil
}

// String is empty until the value is given.
func (v *Inherited) String() string {
	if v == nil || v.Value == nil || !v.given {
		return ""
	}
	return v.Value.String()
}

// IsBoolFlag keeps a wrapped Bool a bare flag.
func (v *Inherited) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

type stringValue string

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }

type secretValue string

func (v *secretValue) String() string     { return "" }
func (v *secretValue) Set(s string) error { *v = secretValue(s); return nil }

// The parse errors are fixed words: strconv's would quote the value, and a
// value may be a secret given to the wrong setting.

type durationValue time.Duration

func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a Go duration")
	}
	*v = durationValue(d)
	return nil
}

type intValue int

func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("not an integer")
	}
	*v = intValue(n)
	return nil
}

type int64Value int64

func (v *int64Value) String() string { return strconv.FormatInt(int64(*v), 10) }
func (v *int64Value) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return errors.New("not an integer")
	}
	*v = int64Value(n)
	return nil
}

type uint64Value uint64

func (v *uint64Value) String() string { return strconv.FormatUint(uint64(*v), 10) }
func (v *uint64Value) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("not a non-negative integer")
	}
	*v = uint64Value(n)
	return nil
}

type boolValue bool

func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("not true or false")
	}
	*v = boolValue(b)
	return nil
}
