package gemm

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Choice is the micro-kernel this machine's BLAS multiplies with, and why.
type Choice struct {
	Kernel string // avx512, avx2, go-fma or go
	Why    string
	// Rates are the trial's figures, in the order tried; empty where
	// there was nothing to choose between.
	Rates []Rate
	ker   kernel
}

// Rate is what one kernel did in the trial: its best of a few 1 ms runs
// on a tile held in cache, in GFLOP/s.
type Rate struct {
	Kernel string  `json:"kernel"`
	GFLOPS float64 `json:"gflops"`
}

// Chosen is the kernel every New BLAS uses. Where this CPU runs more than
// one fast kernel — AVX-512 and AVX2 on most x86-64 — a short trial at the
// first call (a few milliseconds, once a process) picks the fastest, so a
// CPU that runs 512-bit operations in two halves, or slows its clock for
// them, gets the kernel that is fastest on it, not on the machine the
// package was tuned on. Every kernel computes the same bits, so replicas
// that choose differently still agree.
//
// Measured (GFLOP/s of one core, the trial's figures, `ringtrain bench
// cpu`):
//
//	CPU                                        avx512  avx2   chosen
//	Intel Xeon, 2-core VM, AVX-512 (2026-11)   179.6   106.5  avx512
//	the same, another day                      206.0   126.1  avx512
//
// The AMD EPYC (Zen 5) VM the kernels were first tuned on ran the
// AVX-512 kernel before the trial existed; Zen 4, which splits 512-bit
// operations in two, has not been measured.
func Chosen() Choice { return chosen() }

// Shapes names the chosen kernel's tile shapes, rows × columns, the
// first its own.
func (c Choice) Shapes() []string {
	s := []string{fmt.Sprintf("%d×%d", c.ker.mr, c.ker.nr)}
	for _, a := range c.ker.alt {
		s = append(s, fmt.Sprintf("%d×%d", a.mr, a.nr))
	}
	return s
}

// chosen memoizes choose: the CPU does not change under a process.
var chosen = sync.OnceValue(func() Choice { return choose(kernels(), trialRate) })

// choose picks among ks (fastest first by design; the exact Go kernel
// last) with rate, the GFLOP/s a kernel measures. The exact Go kernel only
// stands where nothing else can run: it emulates each FMA in float64.
func choose(ks []kernel, rate func(kernel) float64) Choice {
	fast := ks[:0:0]
	for _, k := range ks {
		if k.name != "go" {
			fast = append(fast, k)
		}
	}
	switch len(fast) {
	case 0:
		return Choice{Kernel: ks[len(ks)-1].name, ker: ks[len(ks)-1],
			Why: "no vector or fused multiply-add kernel for this CPU: the exact Go kernel, slow but the same bits"}
	case 1:
		return Choice{Kernel: fast[0].name, ker: fast[0], Why: "the only fast kernel this CPU runs"}
	}
	const rounds = 3
	best := make([]float64, len(fast))
	for range rounds { // in turn, so that a noisy moment does not fall on one kernel alone
		for i, k := range fast {
			best[i] = max(best[i], rate(k))
		}
	}
	c := Choice{}
	top := 0
	var parts []string
	for i, k := range fast {
		c.Rates = append(c.Rates, Rate{Kernel: k.name, GFLOPS: best[i]})
		parts = append(parts, fmt.Sprintf("%s %.1f", k.name, best[i]))
		if best[i] > best[top] {
			top = i
		}
	}
	c.Kernel, c.ker = fast[top].name, fast[top]
	c.Why = fmt.Sprintf("the fastest in a trial at start, GFLOP/s of one core: %s", strings.Join(parts, ", "))
	return c
}

// trialRate runs k on one tile held in cache for about 1 ms of this
// thread's CPU time and returns its GFLOP/s. CPU time, not the clock's:
// peers started together on one machine (`ringtrain local`) each run the
// trial while the others compete for the cores, and a kernel whose
// millisecond fell where the process waited for a core lost to a slower
// one — a peer in four then multiplied with AVX2 at ~60% of AVX-512's
// rate for the whole run.
func trialRate(k kernel) float64 {
	const depth, batch = 256, 64
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a, b, c := make([]float32, depth*k.mr), make([]float32, depth*k.nr), make([]float32, k.mr*k.nr)
	for i := range a {
		a[i] = 1
	}
	for i := range b {
		b[i] = 0.5
	}
	calls, used := 0, threadClock()
	for used() < time.Millisecond {
		for range batch {
			k.run(depth, a, b, c, k.nr, k.nr, k.mr, false)
		}
		calls += batch
	}
	return float64(2*k.mr*k.nr*depth*calls) / used().Seconds() / 1e9
}

// wallClock returns the monotonic clock's time since the call.
func wallClock() func() time.Duration {
	t0 := time.Now()
	return func() time.Duration { return time.Since(t0) }
}
