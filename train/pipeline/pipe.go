package pipeline

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ringtrain/ringtrain/train"
)

// Stats is what a Pipe measured of its steps.
type Stats struct {
	// PeakInFlight is the most micro-batches it held at once, forwarded
	// and not yet backward; PeakBytes the bytes of their inputs.
	PeakInFlight int
	PeakBytes    int64
	// Sent and Received count boundary frames.
	Sent, Received int
	// Compute is the time spent in the stage's own forward and backward
	// passes, waits on the other stages aside.
	Compute time.Duration
}

// Pipe is one peer's stage of a pipeline, as a train.Model: its
// ForwardBackward runs the batch's micro-batches through the stage by the
// schedule, receiving from and sending to the stages beside it, and
// leaves the stage's parameter gradients (of the batch's mean loss) in
// Grads. Every stage of a column must make the same calls with the same
// sample counts; the loss and the logits every stage reports are the last
// stage's, carried back.
type Pipe struct {
	ctx        context.Context
	cfg        Config
	enc        Encoding
	st         *train.Stage
	s, stages  int
	micro      int
	classes    int // logits a sample: its classes, or a language model's positions × classes
	positions  int // labels a sample: 1, or a language model's context
	row        int // values a sample has in x: its inputs, then its float targets if any
	spec       train.Spec
	prev, next Link
	// in and out are what crosses the boundaries before and after the
	// stage (what the frames carry); useIn maps the stage's inputs to in,
	// and for each of out, fromStage is the stage's output it is (or −1)
	// and fromIn the entry of in passed on (or −1).
	in, out           []train.Carry
	useIn             []int
	fromStage, fromIn []int
	gen, step         uint64
	logits            []float32
	stats             Stats
	// stop, once closed, asks the column to stop after the next step;
	// stopping is closed when it will (this peer was asked, or a frame
	// said so), and flag is set for the frames of that step.
	stop     <-chan struct{}
	stopWhen func() bool
	stopping chan struct{}
	flag     bool
	// later are the sizes of the parameter tensors of the stages after
	// this one, which Gather receives.
	later   []int
	timeout time.Duration
	// pace, when set, is waited for inside every forward and backward call,
	// as if the stage ran on a device: the bench measures a schedule with
	// it where stages on a few cores would only contend for them.
	pace func(backward bool)
}

var (
	_ train.Model      = (*Pipe)(nil)
	_ train.MaskSeeder = (*Pipe)(nil)
)

// New builds stage s of a pipeline for a model whose Batch is the full
// batch. cfg.Split must be set when there is more than one stage (Balance
// or the user's). prev and next are the links to stages s−1 and s+1 (nil
// at the ends; nil until SetLinks gives them). ctx bounds every wait on a
// link for the Pipe's life.
func New(ctx context.Context, cfg Config, model train.ModelConfig, s int, prev, next Link) (*Pipe, error) {
	if err := cfg.Check(model.Spec, model.Batch); err != nil {
		return nil, err
	}
	layers := len(model.Spec.Layers)
	split := cfg.Split
	if cfg.Stages == 1 {
		split = []int{}
	}
	bounds, err := Bounds(split, cfg.Stages, layers)
	if err != nil {
		return nil, err
	}
	if s < 0 || s >= cfg.Stages {
		return nil, fmt.Errorf("stage %d of %d: %w", s, cfg.Stages, ErrConfig)
	}
	if prev != nil && s == 0 || next != nil && s == cfg.Stages-1 {
		return nil, fmt.Errorf("stage %d of %d has no neighbour on that side: %w", s, cfg.Stages, ErrConfig)
	}
	enc, _ := cfg.encoding()
	p := &Pipe{ctx: ctx, cfg: cfg, enc: enc, s: s, stages: cfg.Stages, micro: cfg.MicroSize(model.Batch), prev: prev, next: next,
		stopping: make(chan struct{})}
	mc := model
	mc.Batch = p.micro
	lo, hi := bounds[s][0], bounds[s][1]
	if p.st, err = train.NewStage(train.StageConfig{Model: mc, Lo: lo, Hi: hi, Threads: cfg.Threads}); err != nil {
		return nil, err
	}
	// The logits a sample has, and its labels: a language model's, every
	// position's.
	shapes, _ := model.Spec.Shapes()
	last := shapes[len(shapes)-1]
	p.classes, p.positions, p.row, p.spec = last[len(last)-1], 1, model.Spec.RowValues(), model.Spec
	if len(last) == 2 {
		p.classes, p.positions = last[0]*last[1], last[0]
	}
	sizes, _ := model.Spec.ParamSizes()
	before := 0
	for _, l := range model.Spec.Layers[:hi] {
		if l.Type.HasParams() {
			before += 2
		}
	}
	p.later = sizes[before:]
	p.in = p.st.Inputs()
	if lo > 0 {
		p.in, _ = train.StageCarries(model.Spec, lo)
	}
	if hi < layers {
		p.out, _ = train.StageCarries(model.Spec, hi)
	}
	index := func(cs []train.Carry, name string) int {
		return slices.IndexFunc(cs, func(c train.Carry) bool { return c.Name == name })
	}
	for _, c := range p.st.Inputs() {
		p.useIn = append(p.useIn, index(p.in, c.Name))
	}
	for _, c := range p.out {
		p.fromStage = append(p.fromStage, index(p.st.Outputs(), c.Name))
		from := -1
		if c.Name != "" {
			from = index(p.in, c.Name)
		}
		p.fromIn = append(p.fromIn, from)
	}
	return p, nil
}

// SetGeneration sets the generation every frame carries and must carry:
// the ring the stages are in. Frames of any other are refused. The
// frames' step count starts again.
func (p *Pipe) SetGeneration(gen uint64) { p.gen, p.step = gen, 0 }

// SetLinks replaces the links to the stages beside this one (a new
// generation's), after checking that the stage has exactly the neighbours
// it needs. The old links are the caller's to close.
func (p *Pipe) SetLinks(prev, next Link) error {
	if (p.s > 0) != (prev != nil) || (p.s < p.stages-1) != (next != nil) {
		return fmt.Errorf("stage %d of %d needs links to exactly its neighbours: %w", p.s, p.stages, ErrConfig)
	}
	p.prev, p.next = prev, next
	return nil
}

// SetStop makes a closed stop ask the peers of this stage's column to
// stop after the next step: it begins on them all alike, as the step's
// frames carry the request to every stage of the column. It also clears a
// stop already under way, so that a column stopped to change its peers
// can train again (Stopping is then a new channel).
func (p *Pipe) SetStop(stop <-chan struct{}) {
	p.stop = stop
	if p.flag {
		p.flag, p.stopping = false, make(chan struct{})
	}
}

// SetStopWhen makes f, asked at the start of every step (nil: never), a
// stop request as a closed stop is: the column stops after that step.
// It runs on the goroutine that calls ForwardBackward.
func (p *Pipe) SetStopWhen(f func() bool) { p.stopWhen = f }

// Stopping is closed during the step after which this peer's column
// stops: the channel to give train.Run as its Stop, so that the stage's
// ring hears of it in that step's trailer — and since every stage has a
// peer of the column, every stage's ring does.
func (p *Pipe) Stopping() <-chan struct{} { return p.stopping }

// stopped notes a stop request, this peer's or one a frame carried.
func (p *Pipe) stopped() {
	if !p.flag {
		p.flag = true
		close(p.stopping)
	}
}

// SetTimeout bounds each wait for a frame from a stage beside this one
// (0: only the Pipe's context does): a stage that stalls fails the step.
func (p *Pipe) SetTimeout(d time.Duration) { p.timeout = d }

// recv receives the frame want describes from l, within the timeout.
func (p *Pipe) recv(l Link, want Expect) (*Frame, error) {
	ctx := p.ctx
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	f, err := l.Recv(ctx, want)
	if err != nil {
		return nil, err
	}
	p.stats.Received++
	if f.Stop && f.Kind != Results {
		p.stopped()
	}
	return f, nil
}

// Stats returns what the Pipe measured so far.
func (p *Pipe) Stats() Stats { return p.stats }

// Stage returns the stage this Pipe runs and the number of stages.
func (p *Pipe) Stage() (s, stages int) { return p.s, p.stages }

func sizes(cs []train.Carry) []int {
	out := make([]int, len(cs))
	for i, c := range cs {
		out[i] = c.Values()
	}
	return out
}

// rows is how many samples micro-batch mb of n has.
func (p *Pipe) rows(mb, n int) int { return min(p.micro, n-mb*p.micro) }

// labels is micro-batch mb's labels, on the last stage: its classes, or
// the float targets at the end of each row of x.
func (p *Pipe) labels(x []float32, y []int, mb, rows int) train.Labels {
	if !p.st.Last() {
		return train.Labels{}
	}
	if k := p.st.Targets(); k > 0 {
		w, lo := p.row, mb*p.micro
		t := make([]float32, 0, rows*k)
		for r := lo; r < lo+rows; r++ {
			t = append(t, x[(r+1)*w-k:(r+1)*w]...)
		}
		return train.Labels{Target: t}
	}
	return train.Labels{Class: y[mb*p.micro*p.positions : (mb*p.micro+rows)*p.positions]}
}

func (p *Pipe) check(x []float32, y []int, n int) error {
	if (p.s > 0) != (p.prev != nil) || (p.s < p.stages-1) != (p.next != nil) {
		return fmt.Errorf("pipeline: stage %d of %d is not linked to its neighbours: %w", p.s, p.stages, ErrConfig)
	}
	if n < 1 {
		return fmt.Errorf("pipeline: a batch of %d samples: %w", n, train.ErrStage)
	}
	if p.s == 0 || p.st.Targets() > 0 && p.st.Last() {
		if want := n * p.row; len(x) < want {
			return fmt.Errorf("pipeline: %d values for %d samples of %d: %w", len(x), n, p.row, train.ErrStage)
		}
	}
	if len(y) < n*p.positions {
		return fmt.Errorf("pipeline: %d labels for %d samples of %d: %w", len(y), n, p.positions, train.ErrStage)
	}
	if n > p.micro*p.cfg.MicroBatches {
		return fmt.Errorf("pipeline: %d samples; the model takes up to %d: %w", n, p.micro*p.cfg.MicroBatches, train.ErrStage)
	}
	return nil
}

// input is micro-batch mb's boundary tensors: the data, on the first
// stage; what the stage before sent, on the others.
func (p *Pipe) input(x []float32, mb, rows int) ([][]float32, error) {
	if p.s == 0 {
		w, f := p.row, p.in[0].Values()
		rowsOf := x[mb*p.micro*w : (mb*p.micro+rows)*w]
		if w == f {
			return [][]float32{rowsOf}, nil
		}
		feats := make([]float32, 0, rows*f) // the features without the targets after them
		for r := range rows {
			feats = append(feats, rowsOf[r*w:r*w+f]...)
		}
		return [][]float32{feats}, nil
	}
	f, err := p.recv(p.prev, Expect{Kind: Activations, Enc: p.enc, Stage: p.s - 1, Gen: p.gen, Step: p.step, MB: mb, Rows: rows, Sizes: sizes(p.in)})
	if err != nil {
		return nil, fmt.Errorf("%w: pipeline: stage %d from stage %d: %w", train.ErrCollective, p.s, p.s-1, err)
	}
	return f.Tensors, nil
}

func (p *Pipe) stageIn(in [][]float32) [][]float32 {
	out := make([][]float32, len(p.useIn))
	for k, i := range p.useIn {
		out[k] = in[i]
	}
	return out
}

func (p *Pipe) send(l Link, f *Frame) error {
	f.Enc, f.Stage, f.Gen, f.Step = p.enc, p.s, p.gen, p.step
	if f.Kind == Results {
		// The last stage's logits reach every stage exactly, so that all
		// report the same accuracy whatever the boundary's encoding.
		f.Enc = F32
	}
	f.Stop = f.Stop || p.flag && f.Kind != Results
	if err := l.Send(p.ctx, f); err != nil {
		return fmt.Errorf("%w: pipeline: stage %d sending %v of micro-batch %d: %w", train.ErrCollective, p.s, f.Kind, f.MB, err)
	}
	p.stats.Sent++
	return nil
}

// activations is the frame micro-batch mb sends on: the stage's outputs
// and the saved outputs it passes on from in.
func (p *Pipe) activations(mb, rows int, out, in [][]float32) *Frame {
	f := &Frame{Kind: Activations, MB: mb, Rows: rows, Tensors: make([][]float32, len(p.out))}
	for j := range p.out {
		if k := p.fromStage[j]; k >= 0 {
			f.Tensors[j] = out[k]
		} else {
			f.Tensors[j] = in[p.fromIn[j]]
		}
	}
	return f
}

// stopIfAsked marks this step the last when a stop was asked (SetStop,
// SetStopWhen).
func (p *Pipe) stopIfAsked() {
	select {
	case <-p.stop:
		p.stopped()
	default:
		if p.stopWhen != nil && p.stopWhen() {
			p.stopped()
		}
	}
}

// forward runs micro-batch mb's forward pass through a stage before the
// last, whose inputs are in, and sends its activations on.
func (p *Pipe) forward(mb, rows int, in [][]float32) error {
	t0 := time.Now()
	out, _, err := p.st.Forward(mb, p.stageIn(in), train.Labels{}, rows, true)
	if p.pace != nil {
		p.pace(false)
	}
	p.stats.Compute += time.Since(t0)
	if err != nil {
		return err
	}
	return p.send(p.next, p.activations(mb, rows, out, in))
}

// gradientsBack takes micro-batch mb's gradients from the next stage, if
// any: the frame, and the gradients of this stage's own outputs in it.
func (p *Pipe) gradientsBack(mb, rows int) (*Frame, [][]float32, error) {
	if p.next == nil {
		return nil, nil, nil
	}
	gout, err := p.recv(p.next, Expect{Kind: Gradients, Enc: p.enc, Stage: p.s + 1, Gen: p.gen, Step: p.step, MB: mb, Rows: rows, Sizes: sizes(p.out)})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: pipeline: stage %d from stage %d: %w", train.ErrCollective, p.s, p.s+1, err)
	}
	gstage := make([][]float32, len(p.st.Outputs()))
	for j, k := range p.fromStage {
		if k >= 0 {
			gstage[k] = gout.Tensors[j]
		}
	}
	return gout, gstage, nil
}

// gradients is the frame micro-batch mb sends back: the gradients gin of
// the inputs the stage used and, for the saved outputs it passed on, those
// that came back in gout — summed with its own where a saved output is
// used both here and later.
func (p *Pipe) gradients(mb, rows int, loss float32, gin [][]float32, gout *Frame) *Frame {
	f := &Frame{Kind: Gradients, MB: mb, Rows: rows, Loss: loss, Tensors: make([][]float32, len(p.in))}
	for k, i := range p.useIn {
		f.Tensors[i] = gin[k]
	}
	for j, i := range p.fromIn {
		if i < 0 {
			continue
		}
		if f.Tensors[i] == nil {
			f.Tensors[i] = gout.Tensors[j]
			continue
		}
		sum := slices.Clone(f.Tensors[i])
		for e, v := range gout.Tensors[j] {
			sum[e] += v
		}
		f.Tensors[i] = sum
	}
	return f
}

// ForwardBackward runs one batch through the stage by its schedule and
// leaves the gradients of the batch's mean loss in Grads. A stage beside
// this one that fails, stalls past the timeout or sends what was not
// expected fails the step with a train.ErrCollective: the stage's replica
// applies nothing, as when its ring fails.
func (p *Pipe) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	if err := p.check(x, y, n); err != nil {
		return 0, err
	}
	p.step++
	count := (n + p.micro - 1) / p.micro
	ops, err := Schedule(p.cfg.kind(), p.stages, p.s, count)
	if err != nil {
		return 0, err
	}
	if err := p.st.SetLossScale(1 / float32(n*p.positions)); err != nil {
		return 0, err
	}
	p.st.ZeroGrads()
	p.stopIfAsked()
	held := make(map[int][][]float32, count)
	var heldBytes int64
	losses := make([]float32, count)
	for _, op := range ops {
		mb := op.MB
		rows := p.rows(mb, n)
		if !op.Backward {
			in, err := p.input(x, mb, rows)
			if err != nil {
				return 0, err
			}
			held[mb] = in
			for _, t := range in {
				heldBytes += 4 * int64(len(t))
			}
			p.stats.PeakInFlight = max(p.stats.PeakInFlight, len(held))
			p.stats.PeakBytes = max(p.stats.PeakBytes, heldBytes)
			if p.st.Last() {
				continue // its backward runs the forward pass
			}
			if err := p.forward(mb, rows, in); err != nil {
				return 0, err
			}
			continue
		}
		gout, gstage, err := p.gradientsBack(mb, rows)
		if err != nil {
			return 0, err
		}
		in := held[mb]
		t0 := time.Now()
		gin, loss, err := p.st.Backward(mb, p.stageIn(in), p.labels(x, y, mb, rows), rows, gstage)
		if p.pace != nil {
			p.pace(true)
		}
		p.stats.Compute += time.Since(t0)
		if err != nil {
			return 0, err
		}
		if gout != nil {
			loss = gout.Loss
		}
		losses[mb] = loss
		for _, t := range in {
			heldBytes -= 4 * int64(len(t))
		}
		delete(held, mb)
		if p.prev == nil {
			continue
		}
		if err := p.send(p.prev, p.gradients(mb, rows, loss, gin, gout)); err != nil {
			return 0, err
		}
	}
	var total float32
	for _, l := range losses {
		total += l
	}
	return total, nil
}

// Forward runs one batch through the stage in evaluation mode; the last
// stage's loss and logits come back to every stage.
func (p *Pipe) Forward(x []float32, y []int, n int) (float32, error) {
	if err := p.check(x, y, n); err != nil {
		return 0, err
	}
	p.step++
	count := (n + p.micro - 1) / p.micro
	if err := p.st.SetLossScale(1 / float32(n*p.positions)); err != nil {
		return 0, err
	}
	p.logits = slices.Grow(p.logits[:0], n*p.classes)[:n*p.classes]
	var total float32
	for mb := range count {
		rows := p.rows(mb, n)
		in, err := p.input(x, mb, rows)
		if err != nil {
			return 0, err
		}
		out, loss, err := p.st.Forward(mb, p.stageIn(in), p.labels(x, y, mb, rows), rows, false)
		if err != nil {
			return 0, err
		}
		if p.st.Last() {
			copy(p.logits[mb*p.micro*p.classes:], p.st.Logits()[:rows*p.classes])
			total += loss
			if p.prev != nil {
				if err := p.send(p.prev, &Frame{Kind: Results, MB: mb, Rows: rows, Loss: loss, Tensors: [][]float32{p.st.Logits()[:rows*p.classes]}}); err != nil {
					return 0, err
				}
			}
			continue
		}
		if err := p.send(p.next, p.activations(mb, rows, out, in)); err != nil {
			return 0, err
		}
	}
	if p.st.Last() {
		return total, nil
	}
	for mb := range count {
		rows := p.rows(mb, n)
		f, err := p.recv(p.next, Expect{Kind: Results, Enc: F32, Stage: p.s + 1, Gen: p.gen, Step: p.step, MB: mb, Rows: rows, Sizes: []int{p.classes}})
		if err != nil {
			return 0, fmt.Errorf("%w: pipeline: stage %d from stage %d: %w", train.ErrCollective, p.s, p.s+1, err)
		}
		copy(p.logits[mb*p.micro*p.classes:], f.Tensors[0])
		total += f.Loss
		if p.prev != nil {
			if err := p.send(p.prev, f); err != nil {
				return 0, err
			}
		}
	}
	return total, nil
}

// Gather collects the parameters of the whole model on the first stage:
// each stage sends those of itself and the stages after it to the one
// before. The first stage gets them all, in the whole model's order; the
// others get nil. Every stage of one column calls it, after the same
// step.
func (p *Pipe) Gather() ([][]float32, error) {
	all := slices.Clone(p.st.Params())
	if p.next != nil {
		f, err := p.recv(p.next, Expect{Kind: Params, Enc: F32, Stage: p.s + 1, Gen: p.gen, Step: p.step, Rows: 1, Sizes: p.later})
		if err != nil {
			return nil, fmt.Errorf("pipeline: stage %d gathering from stage %d: %w", p.s, p.s+1, err)
		}
		all = append(all, f.Tensors...)
	}
	if p.prev == nil {
		return all, nil
	}
	f := &Frame{Kind: Params, Rows: 1, Tensors: all}
	f.Enc, f.Stage, f.Gen, f.Step = F32, p.s, p.gen, p.step
	if err := p.prev.Send(p.ctx, f); err != nil {
		return nil, fmt.Errorf("pipeline: stage %d sending its parameters: %w", p.s, err)
	}
	return nil, nil
}

// Params returns the stage's parameters.
func (p *Pipe) Params() [][]float32 { return p.st.Params() }

// Grads returns the stage's gradients of the last batch.
func (p *Pipe) Grads() [][]float32 { return p.st.Grads() }

// Spec is the whole model's spec.
func (p *Pipe) Spec() train.Spec { return p.spec }

// ParamNames names the stage's parameters as the whole model does.
func (p *Pipe) ParamNames() []string { return p.st.ParamNames() }

// Logits returns the last Forward's n × classes logits (the last stage's,
// on every stage).
func (p *Pipe) Logits() []float32 { return p.logits }

// SeedMasks seeds the stage's dropout masks.
func (p *Pipe) SeedMasks(seed uint64) { p.st.SeedMasks(seed) }

// Close frees the stage.
func (p *Pipe) Close() error { return p.st.Close() }
