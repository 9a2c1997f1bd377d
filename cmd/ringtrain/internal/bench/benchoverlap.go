package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/devices"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/engine"
)

// OverlapResult is one line of `bench overlap`: the milliseconds of a step
// each way, all peers stepping at once.
type OverlapResult struct {
	Device   string  `json:"device"`
	Model    string  `json:"model"`
	Batch    int     `json:"batch"`
	Peers    int     `json:"peers"`
	Params   int     `json:"params"`
	BucketMB float64 `json:"bucket_mb"`
	Steps    int     `json:"steps"`
	Run      int     `json:"run,omitempty"`
	// ComputeMS is a step on a ring of one (no gradients leave the
	// device: on a GPU the step replayed from its graph); RingMS one
	// allreduce of every gradient at once, nothing computing.
	ComputeMS float64 `json:"compute_ms"`
	RingMS    float64 `json:"ring_ms"`
	// CallsMS is ComputeMS with each step run call by call, as a step
	// that hands its buckets over runs (no captured graph); where the
	// device captures none, the same step.
	CallsMS float64 `json:"calls_ms"`
	// StepMS is the step with its buckets reduced while backward runs;
	// WholeMS the step with one allreduce after backward.
	StepMS  float64 `json:"step_ms"`
	WholeMS float64 `json:"whole_ms"`
	// Ratio is StepMS / max(ComputeMS, RingMS): 1 where the ring hides
	// behind backward or backward behind the ring; WholeRatio the same
	// of WholeMS.
	Ratio      float64 `json:"ratio"`
	WholeRatio float64 `json:"whole_ratio"`
	Median     bool    `json:"median,omitempty"`
}

// overlapPeer is one replica of `bench overlap`: its model, and a replica
// of it on a ring of one and on the shared ring.
type overlapPeer struct {
	m           train.Model
	alone, ring *train.Replica
	solo, r     *ring.Ring
}

// overlapFlags are `bench overlap`'s settings.
type overlapFlags struct {
	device, model, optimizer          string
	batch, peers, steps, warmup, runs int
	bucketMB                          float64
	dev                               *devices.Options
}

func parseOverlapFlags(args []string, stderr io.Writer) (overlapFlags, error) {
	var f overlapFlags
	fs := flag.NewFlagSet("bench overlap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.device, "device", "cpu", devices.Help)
	fs.StringVar(&f.model, "model", "cnn", "built-in model: mlp, cnn, gpt (torch_gpt.py's) or gpt-large (6 layers, dim 384, 6 heads, context 256)")
	fs.IntVar(&f.batch, "batch", 64, "batch size of each peer")
	fs.IntVar(&f.peers, "peers", 2, "replicas on the ring")
	fs.IntVar(&f.steps, "steps", 100, "timed steps (or allreduces) per phase and run")
	fs.IntVar(&f.warmup, "warmup", 10, "untimed steps of each kind before the first run")
	fs.IntVar(&f.runs, "runs", 3, "runs; the last line is their median")
	fs.Float64Var(&f.bucketMB, "bucket-mb", 25, "gradient bucket size in MiB, as bucket_mb")
	fs.StringVar(&f.optimizer, "optimizer", "adam", "adam, adamw or sgd (as bench device)")
	f.dev = devices.AddFlags(fs)
	if err := cli.ParseFlags(fs, args); err != nil {
		return f, fmt.Errorf("bench overlap: %w: %w", cli.ErrUsage, err)
	}
	if f.batch < 1 || f.steps < 1 || f.runs < 1 || f.warmup < 0 || f.peers < 2 || f.bucketMB <= 0 {
		return f, fmt.Errorf("bench overlap: --batch, --steps, --runs and --bucket-mb must be positive, --peers at least 2: %w", cli.ErrUsage)
	}
	return f, nil
}

// Overlap is `ringtrain bench overlap`: how well a step hides its
// allreduce behind backward. --peers replicas in this process, each with
// its own model on the device (on a GPU, its own context, as processes
// sharing the GPU have), on a ring over loopback TCP; each run times, all
// peers at once, a step alone, the allreduce alone, the step with its
// gradient buckets reduced while backward runs (--bucket-mb, as the
// job's bucket_mb), the step with one allreduce after backward, and the
// step alone run call by call. The batches are benchModel's.
func Overlap(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseOverlapFlags(args, stderr)
	if err != nil {
		return err
	}
	b, err := newOverlapBench(ctx, f)
	if err != nil {
		return fmt.Errorf("bench overlap: %w", err)
	}
	defer b.close()
	res := OverlapResult{Device: deviceName(b.ps[0].m, f.device), Model: f.model, Batch: f.batch, Peers: f.peers, BucketMB: f.bucketMB, Steps: f.steps, Params: len(b.grads[0])}
	kinds := b.kinds(int(f.bucketMB * (1 << 20)))
	for _, k := range kinds {
		if _, err := b.phase(ctx, f.warmup, k); err != nil {
			return fmt.Errorf("bench overlap: warm-up: %w", err)
		}
	}
	enc := json.NewEncoder(stdout)
	var all []OverlapResult
	for run := range f.runs {
		var ms [5]float64
		for k, step := range kinds {
			if ms[k], err = b.phase(ctx, f.steps, step); err != nil {
				return fmt.Errorf("bench overlap: run %d: %w", run+1, err)
			}
		}
		res.Run = run + 1
		res.ComputeMS, res.RingMS, res.StepMS, res.WholeMS, res.CallsMS = ms[0], ms[1], ms[2], ms[3], ms[4]
		res.ratios()
		all = append(all, res)
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	res.Run, res.Median = 0, true
	res.ComputeMS = median(fieldOf(all, func(r OverlapResult) float64 { return r.ComputeMS }))
	res.RingMS = median(fieldOf(all, func(r OverlapResult) float64 { return r.RingMS }))
	res.StepMS = median(fieldOf(all, func(r OverlapResult) float64 { return r.StepMS }))
	res.WholeMS = median(fieldOf(all, func(r OverlapResult) float64 { return r.WholeMS }))
	res.CallsMS = median(fieldOf(all, func(r OverlapResult) float64 { return r.CallsMS }))
	res.ratios()
	return enc.Encode(res)
}

// overlapBench is `bench overlap`'s peers, their batches, and a
// gradient-sized buffer each for the ring alone.
type overlapBench struct {
	ps    []*overlapPeer
	ts    []ring.Transport
	xs    [][]float32
	ys    [][]int
	batch int
	grads [][]float32
}

// overlapStep is one step (or allreduce) s of peer i.
type overlapStep = func(ctx context.Context, i int, p *overlapPeer, s int) error

func newOverlapBench(ctx context.Context, f overlapFlags) (_ *overlapBench, err error) {
	spec, xs, ys, err := benchModel(f.model, f.batch)
	if err != nil {
		return nil, err
	}
	b := &overlapBench{ps: make([]*overlapPeer, f.peers), xs: xs, ys: ys, batch: f.batch}
	if b.ts, err = ring.LoopbackTCP(ctx, f.peers, 1); err != nil {
		return nil, err
	}
	for i := range b.ps {
		if b.ps[i], err = newOverlapPeer(b.ts[i], i, f.peers, f.device, f.optimizer, spec, f.batch, *f.dev); err != nil {
			b.close()
			return nil, fmt.Errorf("peer %d: %w", i, err)
		}
	}
	params := 0
	for _, p := range b.ps[0].m.Params() {
		params += len(p)
	}
	for range b.ps {
		b.grads = append(b.grads, make([]float32, params))
	}
	return b, nil
}

// close closes every peer, or the transport of one not made.
func (b *overlapBench) close() {
	for i, p := range b.ps {
		if p == nil {
			b.ts[i].Close()
			continue
		}
		p.close()
	}
}

// kinds are the phases of a run, in OverlapResult's order: compute
// alone, ring alone, buckets of bucket bytes beside backward, one
// allreduce after backward, compute alone call by call.
func (b *overlapBench) kinds(bucket int) []overlapStep {
	pool := len(b.xs)
	alone := func(ctx context.Context, _ int, p *overlapPeer, s int) error {
		_, err := p.alone.Step(ctx, b.xs[s%pool], b.ys[s%pool], b.batch)
		return err
	}
	allreduce := func(ctx context.Context, i int, p *overlapPeer, _ int) error {
		return p.r.AllreduceMean(ctx, b.grads[i])
	}
	onRing := func(bytes int) overlapStep {
		return func(ctx context.Context, _ int, p *overlapPeer, s int) error {
			p.ring.BucketBytes = bytes
			_, err := p.ring.Step(ctx, b.xs[s%pool], b.ys[s%pool], b.batch)
			return err
		}
	}
	calls := func(ctx context.Context, i int, p *overlapPeer, s int) error {
		if net, ok := p.m.(*engine.Net); ok {
			defer func(g bool) { net.Graph = g }(net.Graph)
			net.Graph = false
		}
		return alone(ctx, i, p, s)
	}
	return []overlapStep{alone, allreduce, onRing(bucket), onRing(0), calls}
}

// phase runs n of step on every peer at once and returns the wall
// milliseconds per step.
func (b *overlapBench) phase(ctx context.Context, n int, step overlapStep) (float64, error) {
	start := time.Now()
	if err := onPeers(ctx, b.ps, func(ctx context.Context, i int, p *overlapPeer) error {
		for s := range n {
			if err := step(ctx, i, p, s); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds() * 1e3 / float64(max(n, 1)), nil
}

func (r *OverlapResult) ratios() {
	bound := max(r.ComputeMS, r.RingMS)
	r.Ratio, r.WholeRatio = r.StepMS/bound, r.WholeMS/bound
}

func fieldOf(rs []OverlapResult, f func(OverlapResult) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// newOverlapPeer builds rank's model on device, its optimizer bound to it,
// and its replicas on a ring of one and on the ring over t (which it
// closes if it fails).
func newOverlapPeer(t ring.Transport, rank, size int, device, optName string, spec train.Spec, batch int, o devices.Options) (_ *overlapPeer, err error) {
	p := &overlapPeer{}
	defer func() {
		if err != nil {
			if p.r == nil {
				t.Close()
			}
			p.close()
		}
	}()
	if p.m, err = devices.NewModel(device, train.ModelConfig{Spec: spec, Batch: batch, Seed: 1}, o); err != nil {
		return nil, err
	}
	opt, err := benchOptimizer(optName, p.m.ParamNames())
	if err != nil {
		return nil, err
	}
	if opt, err = devices.BindOptimizer(p.m, opt, o); err != nil {
		return nil, err
	}
	if p.solo, err = ring.New(nil, ring.Config{Rank: 0, Size: 1}); err != nil {
		return nil, err
	}
	if p.r, err = ring.New(t, ring.Config{Rank: rank, Size: size, Generation: 1}); err != nil {
		return nil, err
	}
	p.alone, p.ring = train.NewReplica(p.m, opt, p.solo), train.NewReplica(p.m, opt, p.r)
	return p, nil
}

func (p *overlapPeer) close() {
	if p.r != nil {
		p.r.Close()
	}
	if p.solo != nil {
		p.solo.Close()
	}
	if p.m != nil {
		p.m.Close()
	}
}

// onPeers runs f for every peer at once and returns the first error; the
// first error cancels the others' context, so none waits on the ring for
// a peer that stopped.
func onPeers(ctx context.Context, ps []*overlapPeer, f func(ctx context.Context, i int, p *overlapPeer) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			if err := f(ctx, i, p); err != nil {
				cancel(fmt.Errorf("peer %d: %w", i, err))
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
