// Package cli is what ringtrain's subcommands share of their command
// line: flags parsed strictly, with --version; sizes with units; and the
// errors main branches on.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// ErrUsage marks a command line that is wrong: main prints the command's
// usage and exits 2.
var ErrUsage = errors.New("usage")

// ErrVersion is asked for with --version: main prints the version and
// exits 0.
var ErrVersion = errors.New("version asked for")

// ParseFlags parses args into fs, with --version added, and refuses
// anything left over: a stray word (--bootstrap A B) would otherwise end
// the flags silently, and what came after it be lost.
func ParseFlags(fs *flag.FlagSet, args []string) error {
	version := AddVersionFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		return ErrVersion
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (a flag takes one value: repeat the flag for more)", fs.Arg(0))
	}
	return nil
}

// AddVersionFlag adds --version to fs, once (a command that parses again
// and again gets the same flag back).
func AddVersionFlag(fs *flag.FlagSet) *VersionFlag {
	if f := fs.Lookup("version"); f != nil {
		if v, ok := f.Value.(*VersionFlag); ok {
			return v
		}
	}
	v := new(VersionFlag)
	fs.Var(v, "version", "print ringtrain's version and exit")
	return v
}

// VersionFlag is --version: a bool flag that remembers it was given.
type VersionFlag bool

func (v *VersionFlag) String() string { return fmt.Sprint(bool(*v)) }

// Set takes the flag's value, as a bool flag does.
func (v *VersionFlag) Set(s string) error {
	b, err := strconv.ParseBool(s)
	*v = VersionFlag(b)
	return err
}

// IsBoolFlag makes --version a flag without a value.
func (v *VersionFlag) IsBoolFlag() bool { return true }

var byteUnits = []struct {
	suffix string
	mult   int
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// ParseBytes reads sizes such as 64MiB, 512KiB or 4096.
func ParseBytes(s string) (int, error) {
	s = strings.TrimSpace(s)
	mult := 1
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a positive whole number with an optional B, KiB, MiB or GiB", s)
	}
	return n * mult, nil
}

// FormatBytes writes n in the largest unit that holds it whole.
func FormatBytes(n int) string {
	for _, u := range byteUnits {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.Itoa(n/u.mult) + u.suffix
		}
	}
	return strconv.Itoa(n) + "B"
}
