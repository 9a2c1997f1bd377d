// Package ringbench measures ring-allreduce the way nccl-tests does, and in
// the same run the pattern ceiling: the same ring of links moving the same
// bytes with no framing and no adding.
//
// Run runs all ranks in this process, each on its own goroutines, so the
// figures include the contention of n ranks on this machine's cores.
// RunRank runs one rank, for a caller that starts each in its own process,
// as gloo's and MPI's benchmarks do, and Combine makes their row.
package ringbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// Transports maps a transport name to a constructor of an n-rank ring. The
// constructor also returns what to call once the transports are closed, to
// stop whatever it started for them (nil if nothing).
type Transports map[string]func(ctx context.Context, n int) ([]ring.Transport, func(), error)

// Builtin returns the transports of package ring: "mem" and "tcp" (loopback).
func Builtin() Transports {
	return Transports{
		"mem": func(_ context.Context, n int) ([]ring.Transport, func(), error) { return ring.MemRing(n), nil, nil },
		"tcp": func(ctx context.Context, n int) ([]ring.Transport, func(), error) {
			ts, err := ring.LoopbackTCP(ctx, n, 1)
			return ts, nil, err
		},
	}
}

// Config says what to measure.
type Config struct {
	Transport string // a key of the Transports given to Run
	Peers     int
	Sizes     []int // buffer sizes in bytes, multiples of 4
	Iters     int   // timed calls per size; the median is reported. Zero means 5.
	// ChunkBytes is the ring's pipelining unit; zero means ring.DefaultChunkBytes.
	ChunkBytes int
	// Loop, with ranks in processes (RunRank), times the Iters calls back
	// to back after one barrier, as nccl-tests does, instead of each after
	// a barrier of its own: a call then starts when this rank's last one
	// ended, not when the barrier's last message reached it, which over a
	// long link differs between ranks by up to a one-way delay.
	Loop bool
}

// Result is one row of the table. Bandwidths follow nccl-tests: algbw =
// bytes/seconds, busbw = algbw·2(n−1)/n; CeilingBusbw is the busbw of the
// bare pattern on the same kind of links.
type Result struct {
	Transport    string  `json:"transport"`
	Peers        int     `json:"peers"`
	Bytes        int     `json:"bytes"`
	Seconds      float64 `json:"seconds"`
	Algbw        float64 `json:"algbw_GBps"`
	Busbw        float64 `json:"busbw_GBps"`
	CeilingBusbw float64 `json:"ceiling_busbw_GBps"`
	// Ratio is the median, over the timed rounds, of busbw / ceiling
	// busbw within the round. Each round runs the allreduce and the
	// pattern back to back, so a slow spell of a shared machine touches
	// both; that makes it steadier than the ratio of the two medians.
	Ratio float64 `json:"ratio"`
	// CPUPerGB is the CPU seconds (user and system, all ranks, sender and
	// receiver) per GB that crossed the links during the allreduce rounds.
	CPUPerGB float64 `json:"cpu_s_per_GB"`
	// RankAvgBusbw, for ranks in processes (Combine), is busbw with each
	// round's time the mean of its ranks' rather than its slowest rank's:
	// nccl-tests' default (-a 1). A rank's time counts from when it left
	// the barrier, which over long links some leave a one-way delay or
	// more before others, and the slowest rank's is the one that left
	// first.
	RankAvgBusbw float64 `json:"busbw_rank_avg_GBps,omitempty"`
}

// check says what is wrong with c, whatever the transport.
func (c Config) check() error {
	if c.Peers < 2 {
		return fmt.Errorf("%d peers; want at least 2", c.Peers)
	}
	for _, size := range c.Sizes {
		if size <= 0 || size%4 != 0 {
			return fmt.Errorf("size %d bytes; want a positive multiple of 4", size)
		}
	}
	return nil
}

func (c Config) iters() int {
	if c.Iters <= 0 {
		return 5
	}
	return c.Iters
}

func busFactor(n int) float64 { return 2 * float64(n-1) / float64(n) }

// Run measures every size in cfg.Sizes, calling emit with each row as soon
// as it is known.
func Run(ctx context.Context, trs Transports, cfg Config, emit func(Result)) error {
	mk, ok := trs[cfg.Transport]
	if !ok {
		names := make([]string, 0, len(trs))
		for k := range trs {
			names = append(names, k)
		}
		slices.Sort(names)
		return fmt.Errorf("unknown transport %q; want one of %v", cfg.Transport, names)
	}
	if err := cfg.check(); err != nil {
		return err
	}
	cfg.Iters = cfg.iters()
	n := cfg.Peers
	ts, done, err := mk(ctx, n)
	if err != nil {
		return err
	}
	rings := make([]*ring.Ring, n)
	defer func() {
		for i, r := range rings {
			if r != nil {
				r.Close()
			} else {
				ts[i].Close()
			}
		}
		if done != nil {
			done()
		}
	}()
	for i := range n {
		if rings[i], err = ring.New(ts[i], ring.Config{Rank: i, Size: n, Generation: 1, ChunkBytes: cfg.ChunkBytes}); err != nil {
			return err
		}
	}
	// The ceiling gets its own links of the same kind: the ring's links
	// carry frames, and mixing raw bytes into them would break it.
	raw, rawDone, err := mk(ctx, n)
	if err != nil {
		return err
	}
	defer func() {
		for _, t := range raw {
			t.Close()
		}
		if rawDone != nil {
			rawDone()
		}
	}()

	for _, size := range cfg.Sizes {
		r, err := measure(ctx, cfg, rings, raw, size)
		if err != nil {
			return err
		}
		emit(r)
	}
	return nil
}

// measure times the allreduce of size bytes on rings, and the bare
// pattern ceiling on raw, taking turns: cfg.Iters timed rounds each after
// one untimed.
func measure(ctx context.Context, cfg Config, rings []*ring.Ring, raw []ring.Transport, size int) (Result, error) {
	n := len(rings)
	bufs := make([][]float32, n)
	for i := range bufs {
		bufs[i] = make([]float32, size/4)
		for j := range bufs[i] {
			bufs[i][j] = float32(j&127) * 0.25
		}
	}
	src, dst := make([][]byte, n), make([][]byte, n)
	for i := range n {
		src[i], dst[i] = make([]byte, size), make([]byte, size)
	}
	// Ring and pattern take turns, so that both see the same machine:
	// on a shared VM the bare pattern alone varies by tens of percent
	// from one second to the next. One untimed round warms both.
	var ringTimes, patTimes, ratios []float64
	var cpu float64 // process CPU seconds in the timed allreduce rounds
	for i := range cfg.Iters + 1 {
		cpu0 := cpuSeconds()
		t, err := timed(func() error {
			return onAll(n, func(i int) error { return rings[i].AllreduceSum(ctx, bufs[i]) })
		})
		if i > 0 {
			cpu += cpuSeconds() - cpu0
		}
		if err != nil {
			return Result{}, fmt.Errorf("allreduce of %d bytes: %w", size, err)
		}
		p, err := timed(func() error { return pattern(raw, src, dst) })
		if err != nil {
			return Result{}, fmt.Errorf("pattern ceiling of %d bytes: %w", size, err)
		}
		if i > 0 {
			ringTimes, patTimes, ratios = append(ringTimes, t), append(patTimes, p), append(ratios, p/t)
		}
	}
	ringTime, patTime := median(ringTimes), median(patTimes)
	algbw := float64(size) / ringTime / 1e9
	return Result{
		Transport:    cfg.Transport,
		Peers:        n,
		Bytes:        size,
		Seconds:      ringTime,
		Algbw:        algbw,
		Busbw:        algbw * busFactor(n),
		CeilingBusbw: float64(size) / patTime / 1e9 * busFactor(n),
		Ratio:        median(ratios),
		// Every rank sends 2(n−1)/n of the buffer per call.
		CPUPerGB: cpu / (float64(cfg.Iters) * float64(size) * 2 * float64(n-1) / 1e9),
	}, nil
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func timed(f func() error) (float64, error) {
	start := time.Now()
	err := f()
	return time.Since(start).Seconds(), err
}

func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

func onAll(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pattern moves what a ring-allreduce moves — in step s of 2(n−1), every
// rank sends segment rank−s of its buffer to its successor and receives
// segment rank−s−1, all ranks at once — and nothing else: no headers, no
// adding, no waiting for a segment to arrive before sending it on. src and
// dst are each rank's whole buffer, so the pattern touches as much memory as
// the allreduce does.
func pattern(ts []ring.Transport, src, dst [][]byte) error {
	n := len(ts)
	steps := 2 * (n - 1)
	seg := func(b []byte, k int) []byte {
		k = ((k % n) + n) % n
		return b[k*len(b)/n : (k+1)*len(b)/n]
	}
	return onAll(n, func(i int) error {
		var wg sync.WaitGroup
		var werr error
		wg.Go(func() {
			for s := range steps {
				if _, werr = ts[i].Write(seg(src[i], i-s)); werr != nil {
					return
				}
			}
		})
		var rerr error
		for s := range steps {
			if _, rerr = io.ReadFull(ts[i], seg(dst[i], i-s-1)); rerr != nil {
				break
			}
		}
		wg.Wait()
		return errors.Join(werr, rerr)
	})
}
