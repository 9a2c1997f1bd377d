package bench

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/train"
)

// CPUReport is `bench cpu`'s line.
type CPUReport struct {
	CPU      string   `json:"cpu"`
	Arch     string   `json:"arch"`
	Cores    int      `json:"cores"`
	Features []string `json:"features"`
	Threads  int      `json:"threads"`
	train.KernelReport
}

// CPU is `ringtrain bench cpu`: which kernels training on this
// CPU gets and why, as one JSON line (the matrix kernel's trial included),
// so that a user can tell what their machine got.
func CPU(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench cpu", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench cpu: %w: %w", cli.ErrUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench cpu: unexpected argument %q: %w", fs.Arg(0), cli.ErrUsage)
	}
	r := CPUReport{CPU: cpuModel(), Arch: runtime.GOARCH, Cores: runtime.NumCPU(), Features: cpuFeatures(),
		Threads: runtime.GOMAXPROCS(0), KernelReport: train.Kernels()}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, string(b))
	return err
}

// cpuModel is the CPU's name as Linux gives it, or the architecture.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

// cpuFeatures lists what the kernels look for.
func cpuFeatures() []string {
	var fs []string
	for _, f := range []struct {
		name string
		has  bool
	}{
		{"avx512f", cpu.X86.HasAVX512F}, {"avx2", cpu.X86.HasAVX2}, {"fma", cpu.X86.HasFMA},
		{"asimd", cpu.ARM64.HasASIMD}, {"fphp", cpu.ARM64.HasFPHP},
	} {
		if f.has {
			fs = append(fs, f.name)
		}
	}
	return fs
}
