package ringbench

import (
	"context"
	"fmt"
	"slices"

	"github.com/ringtrain/ringtrain/ring"
)

// RankResult is what one rank measured of one buffer size when every rank
// runs in its own process, as gloo's and MPI's benchmarks run them: the
// time of each timed call on this rank, and this process's CPU seconds
// over them.
type RankResult struct {
	Rank    int       `json:"rank"`
	Bytes   int       `json:"bytes"`
	Seconds []float64 `json:"seconds"`
	CPU     float64   `json:"cpu_s"`
}

// RunRank runs, on rank of a ring of cfg.Peers over t, one untimed and then
// cfg.Iters timed AllreduceSum calls of every size in cfg.Sizes, each after
// a Barrier — or, with cfg.Loop, all of them after one, timed together —
// and emits each size's times (with Loop, one: the calls' mean). The other ranks must run the same cfg; each call
// waits for its neighbours, so the calls of all ranks proceed together;
// at the end all leave the ring together (ring.Ring.Leave). t is closed
// when RunRank returns.
func RunRank(ctx context.Context, t ring.Transport, rank int, cfg Config, emit func(RankResult)) error {
	if err := cfg.check(); err != nil {
		t.Close()
		return err
	}
	r, err := ring.New(t, ring.Config{Rank: rank, Size: cfg.Peers, Generation: 1, ChunkBytes: cfg.ChunkBytes})
	if err != nil {
		t.Close()
		return err
	}
	defer r.Close()
	for _, size := range cfg.Sizes {
		buf := make([]float32, size/4)
		res := RankResult{Rank: rank, Bytes: size}
		if cfg.Loop {
			if err := loopRank(ctx, r, rank, cfg.iters(), buf, &res); err != nil {
				return err
			}
			emit(res)
			continue
		}
		for i := range cfg.iters() + 1 {
			for j := range buf {
				buf[j] = float32(j&127) * 0.25
			}
			// A barrier first, as gloo's and MPI's benchmarks do: a rank's
			// time is then the call's, not its wait for a neighbour
			// still finishing the last one.
			if err := r.Barrier(ctx); err != nil {
				return fmt.Errorf("rank %d: barrier: %w", rank, err)
			}
			cpu0 := cpuSeconds()
			s, err := timed(func() error { return r.AllreduceSum(ctx, buf) })
			if err != nil {
				return fmt.Errorf("rank %d: allreduce of %d bytes: %w", rank, size, err)
			}
			if i > 0 {
				res.Seconds = append(res.Seconds, s)
				res.CPU += cpuSeconds() - cpu0
			}
		}
		emit(res)
	}
	// Every rank leaves together: one that exited at once could have its
	// kernel reset the links, losing the last frames a slower neighbour
	// had not read yet.
	if err := r.Barrier(ctx); err != nil {
		return fmt.Errorf("rank %d: the last barrier: %w", rank, err)
	}
	return r.Leave(ctx)
}

// loopRank is RunRank's size with cfg.Loop: one untimed call, a barrier,
// then iters calls timed together into res.
func loopRank(ctx context.Context, r *ring.Ring, rank, iters int, buf []float32, res *RankResult) error {
	call := func() error {
		for j := range buf {
			buf[j] = float32(j&127) * 0.25
		}
		return r.AllreduceSum(ctx, buf)
	}
	if err := call(); err != nil {
		return fmt.Errorf("rank %d: allreduce of %d bytes: %w", rank, res.Bytes, err)
	}
	if err := r.Barrier(ctx); err != nil {
		return fmt.Errorf("rank %d: barrier: %w", rank, err)
	}
	cpu0 := cpuSeconds()
	s, err := timed(func() error {
		for range iters {
			if err := call(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rank %d: allreduce of %d bytes: %w", rank, res.Bytes, err)
	}
	res.Seconds = []float64{s / float64(iters)}
	res.CPU = (cpuSeconds() - cpu0) / float64(iters)
	return nil
}

// Combine makes one table row from every rank's result for one size. A
// round lasts until its slowest rank is done, as gloo's benchmark and
// nccl-tests with -a 3 count it, and RankAvgBusbw takes the ranks' mean
// instead, nccl-tests' default; the row is the median round. There is no
// ceiling: the pattern runs only within one process (CeilingBusbw and
// Ratio are 0).
func Combine(transport string, rs []RankResult) (Result, error) {
	n := len(rs)
	if n < 2 {
		return Result{}, fmt.Errorf("%d ranks' results; want at least 2", n)
	}
	rounds := len(rs[0].Seconds)
	slowest, mean := make([]float64, rounds), make([]float64, rounds)
	var cpu float64
	seen := make([]bool, n)
	for _, r := range rs {
		if r.Rank < 0 || r.Rank >= n || seen[r.Rank] {
			return Result{}, fmt.Errorf("rank %d reported twice or out of a ring of %d", r.Rank, n)
		}
		seen[r.Rank] = true
		if r.Bytes != rs[0].Bytes || len(r.Seconds) != rounds || rounds == 0 {
			return Result{}, fmt.Errorf("rank %d measured %d rounds of %d bytes, rank %d %d of %d", r.Rank, len(r.Seconds), r.Bytes, rs[0].Rank, rounds, rs[0].Bytes)
		}
		for i, s := range r.Seconds {
			slowest[i] = max(slowest[i], s)
			mean[i] += s / float64(n)
		}
		cpu += r.CPU
	}
	t := median(slices.Clone(slowest))
	size := rs[0].Bytes
	algbw := float64(size) / t / 1e9
	return Result{Transport: transport, Peers: n, Bytes: size, Seconds: t, Algbw: algbw, Busbw: algbw * busFactor(n),
		CPUPerGB:     cpu / (float64(rounds) * float64(size) * 2 * float64(n-1) / 1e9),
		RankAvgBusbw: float64(size) / median(mean) / 1e9 * busFactor(n)}, nil
}
