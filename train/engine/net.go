package engine

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ringtrain/ringtrain/train"
)

// ErrUnsupported means a spec has a layer this engine does not have.
var ErrUnsupported = errors.New("engine: layer not supported")

// ErrOutOfMemory means the model and batch do not fit in the device's
// memory.
var ErrOutOfMemory = errors.New("engine: out of device memory")

// layer is one step of the plan.
type layer struct {
	kind    train.LayerType
	in, out int  // values per sample, before and after
	w, b    int  // indices of weight and bias in params; -1 if none
	conv    Conv // conv2d
	pool    Pool // maxpool2d, per sample (Planes = channels)
	outC    int  // conv2d: output channels
	// A language model's activations are rows of one position each: rows
	// per sample (1 for the image models), inW and outW values a row.
	rows, inW, outW int
	heads           int // attention
	save            int // the saved activation this layer's output is (index into saves), or -1
	from            int // add: the saved activation it adds, or -1
}

// saved is an activation a later add reads: its buffer, and the sum of
// the gradients the adds send back to it.
type saved struct {
	act  int // index into acts
	grad Buf
}

// Net is a model of linear, conv2d, maxpool2d, relu and flatten layers run
// on an Ops. It is a train.Model; its parameters are the ones
// train.InitParams draws, in the same order, shapes and names as the
// gorgonia model's, so the two start alike and share checkpoints.
//
// The parameters live on the device. Params hands out host copies, brought
// down when asked for and sent back before the next step that follows (the
// caller may have written them): checkpoints, the hash check, broadcasts
// and resume see and set the device's values, and a step does not pay for
// them. Net is also a train.Resident, and Optimizer binds an optimizer to
// run on the device: then a step moves only the gradients to the host and
// back, and a ring of one moves nothing but the batch in and the loss out.
type Net struct {
	ops Ops
	// forwardEnd is when the last forward pass ended, on Host, whose ops
	// run as they are called (a device queues them, and ends later).
	forwardEnd time.Time
	batch      int
	classes    int
	inputs     int // values per sample
	layers     []layer
	names      []string
	nparams    int
	params     [][]float32 // host copies of the parameters
	grads      [][]float32 // host: ForwardBackward's gradients
	// hostOK: params hold the device's values; devOK: the device holds
	// params' (false once Params has let a caller write them).
	hostOK, devOK bool
	logitsOK      bool // logits hold the last pass's

	dParam  Buf   // every parameter, end to end
	dGrad   Buf   // every gradient, end to end
	dParams []Buf // views of dParam, one per tensor
	dGrads  []Buf
	acts    []Buf // acts[i] is layer i's input; the last, the logits
	dActs   []Buf // gradients of the loss by acts
	saves   []saved
	stats   []Buf // per layer: a layernorm's means and 1/σ, an attention's probabilities
	scratch Buf   // the largest attention's probabilities' gradient, or layernorm's dy·x̂
	// positions is the labels a sample has: 1, or a language model's
	// positions (then its first layer is an embedding of tokens, vocab).
	positions, vocab int
	cols             []Buf  // per layer: a conv's im2col of its input, kept for backward
	plans            []int  // per layer: a conv's plan on the Ops's convolver, or -1 (im2col)
	convs            string // what Device adds: how the convolutions run, where not all by im2col
	dCol             Buf    // the largest conv's
	tmp              Buf    // the largest conv's channel-major output or gradient
	labels           Buf
	dLoss            Buf // per-row losses
	flags            Buf // [0]: the gradients hold a NaN or Inf; [1]: always 0; [2]: the averaged ones do
	hyper            Buf // the optimizer's hyperparameters

	xPin, yPin, lossPin, flagPin, hyperPin []float32 // page-locked staging
	flatPin                                []float32 // the replica's flat buffer
	// staged is how many of the flat buffer's last gradient values
	// StageGrads has sent to dGrad since the last optimizer step.
	staged int
	logits []float32
	err    error // sticky: a failed optimizer Step

	// Graph makes full-batch steps replay a captured queue of calls (a CUDA
	// graph on a GPU) after one warm-up step that runs call by call, so
	// libraries set themselves up (cuBLAS its workspace) outside the
	// capture. On by default.
	Graph bool
	fb    replayer // ForwardBackwardFlat's
	lb    replayer // ForwardBackwardLayers' into the flat buffer
	// handovers are the layers' copies the last ForwardBackwardLayers into
	// the flat buffer queued — or, replayed, the copies its graph holds.
	handovers []handover
}

// handover is a layer's gradients on their way to flat[lo:].
type handover struct {
	lo   int
	wait func() error
}

// replayer is one captured queue of calls and what it was captured for.
type replayer struct {
	key    *float32 // the host memory it copies to or from
	warm   bool
	replay func() error
}

// run runs queue: replayed from a capture when replay is allowed and the
// Net's Graph is on, else call by call.
func (n *Net) run(r *replayer, key *float32, replay bool, queue func() error) error {
	if !replay || !n.Graph {
		return queue()
	}
	if r.key != key { // captured for other memory: capture again
		*r = replayer{key: key}
	}
	switch {
	case r.replay != nil:
		return r.replay()
	case !r.warm:
		r.warm = true
		return queue()
	}
	var err error
	r.replay, err = n.ops.Capture(queue)
	return err
}

var (
	_ train.Model    = (*Net)(nil)
	_ train.Resident = (*Net)(nil)
	_ train.Layered  = (*Net)(nil)
)

// align keeps every buffer of the arena on a 256-byte boundary, which
// cuBLAS and coalesced loads like.
const align = 64

// New builds the network of cfg on ops; the Net owns ops from then on. All
// device memory a step needs is allocated here, at once: a model or batch
// too large for the device fails now, with the sizes, not mid-step.
func New(ops Ops, cfg train.ModelConfig) (_ *Net, err error) {
	defer func() {
		if err != nil {
			ops.Close()
		}
	}()
	shapes, err := cfg.Shapes()
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cfg.Spec.Loss != train.CrossEntropy {
		return nil, fmt.Errorf("engine: loss %s: %w; this engine has cross-entropy (use the cpu device)", cfg.Spec.Loss, ErrUnsupported)
	}
	init, err := train.InitParams(cfg)
	if err != nil {
		return nil, err
	}
	last := shapes[len(shapes)-1]
	n := &Net{ops: ops, batch: cfg.Batch, inputs: size(cfg.Spec.Input), classes: last[len(last)-1]}
	n.positions = size(last) / n.classes
	if err := n.layout(cfg.Spec, shapes, init); err != nil {
		return nil, err
	}
	n.planConvs()
	if err := n.allocate(); err != nil {
		return nil, err
	}
	n.logits = make([]float32, n.batch*n.positions*n.classes)
	n.hostOK, n.Graph = true, true
	if err := n.ensureDevice(); err != nil {
		return nil, err
	}
	return n, nil
}

// size is the number of values of a shape.
func size(s []int) int {
	v := 1
	for _, d := range s {
		v *= d
	}
	return v
}

// layout plans the layers of spec, whose outputs have shapes, and takes
// their parameters from init.
func (n *Net) layout(spec train.Spec, shapes [][]int, init []train.Param) error {
	in := spec.Input
	savedAs := map[string]int{}
	for i, l := range spec.Layers {
		ly := layer{kind: l.Type, in: size(in), out: size(shapes[i]), w: -1, b: -1, rows: 1, save: -1, from: -1}
		if len(in) == 2 { // rows of positions
			ly.rows = in[0]
		}
		ly.inW, ly.outW = ly.in/ly.rows, ly.out/ly.rows
		switch l.Type {
		case train.LayerLinear, train.LayerLayerNorm:
			ly.w, ly.b = len(n.params), len(n.params)+1
		case train.LayerEmbedding:
			if i > 0 {
				return fmt.Errorf("engine: layer %d (embedding): %w; an embedding comes first", i, ErrUnsupported)
			}
			ly.w, ly.b, ly.rows, ly.outW = len(n.params), len(n.params)+1, in[0], shapes[i][1]
			n.vocab = len(init[ly.w].Data) / ly.outW
		case train.LayerConv2D:
			ly.w, ly.b = len(n.params), len(n.params)+1
			ly.conv = NewConv(in[0], in[1], in[2], l.Kernel, l.Pad)
			ly.outC = l.Out
		case train.LayerMaxPool2D:
			ly.pool = NewPool(in[0], in[1], in[2], l.Kernel)
		case train.LayerAttention:
			ly.heads = l.Heads
		case train.LayerAdd:
			ly.from = savedAs[l.From]
		case train.LayerReLU, train.LayerFlatten, train.LayerGELU:
		default:
			return fmt.Errorf("engine: layer %d (%s): %w; this engine has linear, conv2d, maxpool2d, relu, flatten, "+
				"embedding, layernorm, attention, gelu and add (use the cpu device)", i, l.Type, ErrUnsupported)
		}
		if l.Save != "" {
			ly.save = len(n.saves)
			savedAs[l.Save] = ly.save
			n.saves = append(n.saves, saved{act: i + 1})
		}
		if ly.w >= 0 {
			for _, p := range init[ly.w : ly.w+2] {
				n.params = append(n.params, p.Data)
				n.grads = append(n.grads, make([]float32, len(p.Data)))
				n.names = append(n.names, p.Name)
				n.nparams += len(p.Data)
			}
		}
		n.layers = append(n.layers, ly)
		in = shapes[i]
	}
	return nil
}

// planConvs has an Ops that convolves directly plan each conv2d layer; a
// layer it cannot plan keeps im2col and a GEMM, and Device says why.
func (n *Net) planConvs() {
	n.plans = make([]int, len(n.layers))
	cv, _ := n.ops.(convolver)
	var planned, all int
	var why error
	for k, ly := range n.layers {
		n.plans[k] = -1
		if ly.kind != train.LayerConv2D {
			continue
		}
		all++
		if cv == nil {
			continue
		}
		p, err := cv.ConvPlan(ly.conv, ly.outC, n.batch)
		if err != nil {
			why = fmt.Errorf("layer %d: %w", k, err)
			continue
		}
		n.plans[k] = p
		planned++
	}
	switch {
	case all == 0 || cv == nil:
	case planned == all:
		n.convs = "convolutions direct"
	case why != nil:
		n.convs = fmt.Sprintf("%d of %d convolutions direct, the rest by im2col (%v)", planned, all, why)
	}
}

// allocate plans the arena of every buffer a step uses, then allocates it
// in one piece, and the page-locked staging beside it.
func (n *Net) allocate() error {
	pl := n.planArena()
	offs := make([]int, len(pl.sizes))
	total := 0
	for k, s := range pl.sizes {
		offs[k] = total
		total += (s + align - 1) / align * align
	}
	ops := n.ops
	arena, err := ops.Alloc(total)
	if err != nil {
		free, all := ops.Free()
		return fmt.Errorf("engine: %d parameters at batch %d need %.1f MiB of device memory on %s (%.1f MiB free of %.1f); try a smaller batch: %w: %w",
			n.nparams, n.batch, mib(4*int64(total)), ops.Name(), mib(free), mib(all), ErrOutOfMemory, err)
	}
	buf := func(k int) Buf {
		if k < 0 {
			return nil
		}
		return ops.Slice(arena, offs[k], pl.sizes[k])
	}
	n.dParam, n.dGrad = buf(pl.param), buf(pl.grad)
	o := 0
	for _, p := range n.params {
		n.dParams = append(n.dParams, ops.Slice(n.dParam, o, len(p)))
		n.dGrads = append(n.dGrads, ops.Slice(n.dGrad, o, len(p)))
		o += len(p)
	}
	for k := range pl.act {
		n.acts, n.dActs = append(n.acts, buf(pl.act[k])), append(n.dActs, buf(pl.dAct[k]))
	}
	for k := range n.layers {
		n.cols, n.stats = append(n.cols, buf(pl.col[k])), append(n.stats, buf(pl.stats[k]))
	}
	for k := range n.saves {
		n.saves[k].grad = buf(pl.save[k])
	}
	n.dCol, n.tmp, n.scratch = buf(pl.dCol), buf(pl.tmp), buf(pl.scratch)
	n.labels, n.dLoss, n.flags, n.hyper = buf(pl.labels), buf(pl.loss), buf(pl.flags), buf(pl.hyper)
	pin := func(size int) []float32 {
		if err != nil {
			return nil
		}
		var p []float32
		p, err = ops.Pinned(size)
		return p
	}
	labels := pl.sizes[pl.labels]
	n.xPin, n.yPin, n.lossPin = pin(n.batch*n.inputs), pin(labels), pin(labels)
	n.flagPin, n.hyperPin = pin(3), pin(hyperLen)
	if err != nil {
		return fmt.Errorf("engine: page-locked host memory for %s: %w", ops.Name(), err)
	}
	return nil
}

// arenaPlan is where each of a Net's device buffers lies in its one
// arena: sizes holds every buffer's length in floats, and the other
// fields index sizes (-1: the layer has no such buffer).
type arenaPlan struct {
	sizes                                          []int
	param, grad                                    int
	act, dAct                                      []int // by layer boundary, the input's first
	col, stats, save                               []int // by layer; by saved activation
	dCol, tmp, scratch, labels, loss, flags, hyper int
}

// planArena lays out the buffers the net's layers need at its batch: a
// flatten shares its input's, an add its output's gradient, and the
// per-layer scratch is sized for the largest layer that uses it.
func (n *Net) planArena() *arenaPlan {
	pl := &arenaPlan{}
	want := func(size int) int {
		pl.sizes = append(pl.sizes, size)
		return len(pl.sizes) - 1
	}
	pl.param, pl.grad = want(n.nparams), want(n.nparams)
	pl.act, pl.dAct = []int{want(n.batch * n.inputs)}, []int{want(n.batch * n.inputs)}
	pl.col, pl.stats, pl.save = make([]int, len(n.layers)), make([]int, len(n.layers)), make([]int, len(n.saves))
	maxCol, maxTmp, maxScratch := 0, 0, 0
	for k, ly := range n.layers {
		pl.col[k], pl.stats[k] = -1, -1
		last := len(pl.act) - 1
		switch ly.kind {
		case train.LayerFlatten: // the same values, seen flat
			pl.act, pl.dAct = append(pl.act, pl.act[last]), append(pl.dAct, pl.dAct[last])
			continue
		case train.LayerAdd: // its input's gradient is its output's
			pl.act, pl.dAct = append(pl.act, want(n.batch*ly.out)), append(pl.dAct, pl.dAct[last])
			continue
		case train.LayerConv2D:
			if n.plans[k] >= 0 {
				break
			}
			pl.col[k] = want(n.batch * ly.conv.ColRows() * ly.conv.ColCols())
			maxCol = max(maxCol, ly.conv.ColRows()*ly.conv.ColCols())
			maxTmp = max(maxTmp, ly.outC*ly.conv.ColCols())
		case train.LayerLayerNorm:
			pl.stats[k] = want(2 * n.batch * ly.rows)
			maxScratch = max(maxScratch, ly.in)
		case train.LayerAttention:
			pl.stats[k] = want(n.batch * ly.heads * ly.rows * ly.rows)
			maxScratch = max(maxScratch, ly.heads*ly.rows*ly.rows)
		}
		pl.act, pl.dAct = append(pl.act, want(n.batch*ly.out)), append(pl.dAct, want(n.batch*ly.out))
	}
	for k, sv := range n.saves {
		pl.save[k] = want(n.batch * n.layers[sv.act-1].out)
	}
	pl.dCol, pl.tmp, pl.scratch = want(n.batch*maxCol), want(n.batch*maxTmp), want(n.batch*maxScratch)
	labels := n.batch * n.positions
	pl.labels, pl.loss, pl.flags, pl.hyper = want(labels), want(labels), want(3), want(hyperLen)
	return pl
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// errs keeps the first error of a run of calls.
type errs struct{ err error }

func (e *errs) do(err error) {
	if e.err == nil && err != nil {
		e.err = err
	}
}

// ensureDevice sends the host's parameters to the device if a caller of
// Params may have changed them.
func (n *Net) ensureDevice() error {
	if n.err != nil {
		return n.err
	}
	if n.devOK {
		return nil
	}
	var e errs
	for i, p := range n.params {
		e.do(n.ops.Upload(n.dParams[i], p))
	}
	if e.err != nil {
		return fmt.Errorf("engine: parameters to %s: %w", n.ops.Name(), e.err)
	}
	n.devOK = true
	return nil
}

// updated records that the device's parameters changed.
func (n *Net) updated() { n.hostOK, n.logitsOK = false, false }

// begin readies the parameters and stages a batch, as every pass starts.
func (n *Net) begin(x []float32, y []int, rows int) error {
	if n.staged > 0 {
		// Staged for an optimizer step that never came (the ring failed):
		// those copies may still be on their way into dGrad, which this
		// pass writes, and are not its gradients.
		n.staged = 0
		if err := n.ops.Sync(); err != nil {
			return err
		}
	}
	if err := n.ensureDevice(); err != nil {
		return err
	}
	return n.stage(x, y, rows)
}

// stage checks a batch and puts it in page-locked memory.
func (n *Net) stage(x []float32, y []int, rows int) error {
	if rows < 1 || rows > n.batch || len(x) != rows*n.inputs || len(y) != rows*n.positions {
		return fmt.Errorf("engine: batch of %d samples with %d values and %d labels; model takes up to %d samples of %d values and %d labels",
			rows, len(x), len(y), n.batch, n.inputs, n.positions)
	}
	for i, l := range y {
		if l < 0 || l >= n.classes {
			return fmt.Errorf("engine: label %d of sample %d outside [0, %d)", l, i/n.positions, n.classes)
		}
	}
	if n.vocab > 0 {
		for i, v := range x {
			if t := int(v); float32(t) != v || t < 0 || t >= n.vocab {
				return fmt.Errorf("engine: token %v at sample %d position %d; want a whole number in [0, %d)", v, i/n.inputs, i%n.inputs, n.vocab)
			}
		}
	}
	copy(n.xPin, x)
	clear(n.xPin[len(x):])
	clear(n.yPin)
	for i, l := range y {
		n.yPin[i] = float32(l)
	}
	return nil
}

// queueForward queues the batch's upload, the forward pass and the loss.
func (n *Net) queueForward(rows int) error {
	var e errs
	e.do(n.ops.UploadAsync(n.acts[0], n.xPin))
	e.do(n.ops.UploadAsync(n.labels, n.yPin))
	for i := range n.layers {
		e.do(n.forwardLayer(i))
	}
	logits := n.acts[len(n.acts)-1]
	dLogits := n.dActs[len(n.dActs)-1]
	e.do(n.ops.SoftmaxXent(logits, n.labels, dLogits, n.dLoss, n.batch*n.positions, rows*n.positions, n.classes))
	e.do(n.ops.DownloadAsync(n.lossPin, n.dLoss))
	if _, ok := n.ops.(Host); ok {
		n.forwardEnd = time.Now()
	}
	return e.err
}

// ForwardEnd is when the last forward pass ended, on Host; the zero time
// on a device, where the host only queued it.
func (n *Net) ForwardEnd() time.Time { return n.forwardEnd }

func (n *Net) queueBackward() error {
	var e errs
	e.do(n.clearSaved())
	for i := len(n.layers) - 1; i >= 0; i-- {
		e.do(n.backward(i))
	}
	return e.err
}

// clearSaved zeroes the gradients the adds send back, before a backward
// pass sums them.
func (n *Net) clearSaved() error {
	for _, sv := range n.saves {
		if err := n.ops.Zero(sv.grad); err != nil {
			return err
		}
	}
	return nil
}

// loss is the mean loss of the first rows samples' labels, summed on the
// host in row order (the same bits on every device).
func (n *Net) loss(rows int) float32 {
	sum := float32(0)
	for _, l := range n.lossPin[:rows*n.positions] {
		sum += l
	}
	return sum / float32(rows*n.positions)
}

// ForwardBackward computes the mean loss of the first n samples and its
// gradients, which it leaves in Grads (host memory).
func (n *Net) ForwardBackward(x []float32, y []int, rows int) (float32, error) {
	if err := n.begin(x, y, rows); err != nil {
		return 0, err
	}
	var e errs
	e.do(n.queueForward(rows))
	e.do(n.queueBackward())
	e.do(n.ops.Sync())
	for i, g := range n.dGrads {
		e.do(n.ops.Download(n.grads[i], g))
	}
	if e.err != nil {
		return 0, fmt.Errorf("engine: forward and backward on %s: %w", n.ops.Name(), e.err)
	}
	n.logitsOK = false
	return n.loss(rows), nil
}

// FlatBuffer returns size values of page-locked host memory for the
// replica's flat buffer; ForwardBackwardFlat copies into it without a
// staging copy. A larger size than before gets new memory (the old stays
// until Close).
func (n *Net) FlatBuffer(size int) ([]float32, error) {
	if cap(n.flatPin) < size {
		p, err := n.ops.Pinned(size)
		if err != nil {
			return nil, fmt.Errorf("engine: %d values of page-locked host memory: %w", size, err)
		}
		n.flatPin = p
	}
	n.flatPin = n.flatPin[:size]
	clear(n.flatPin)
	return n.flatPin, nil
}

// pinned reports whether v starts the flat buffer, so async copies may
// use it.
func (n *Net) pinned(v []float32) bool {
	return len(v) > 0 && len(n.flatPin) > 0 && &v[0] == &n.flatPin[0]
}

// ForwardBackwardFlat is ForwardBackward leaving the gradients end to end
// in flat[:P] (P the values of all Params), checked for NaN and Inf on the
// device: bad is the first tensor that holds one, or -1.
func (n *Net) ForwardBackwardFlat(x []float32, y []int, rows int, flat []float32) (loss float32, bad int, err error) {
	if len(flat) < n.nparams {
		return 0, -1, fmt.Errorf("engine: flat buffer of %d values for %d gradients", len(flat), n.nparams)
	}
	if err := n.begin(x, y, rows); err != nil {
		return 0, -1, err
	}
	var e errs
	if n.pinned(flat) {
		e.do(n.run(&n.fb, &flat[0], rows == n.batch, func() error {
			var q errs
			q.do(n.queueForward(rows))
			q.do(n.queueBackward())
			q.do(n.queueCheck())
			q.do(n.ops.DownloadAsync(n.flagPin[:1], n.ops.Slice(n.flags, 0, 1)))
			q.do(n.ops.DownloadAsync(flat[:n.nparams], n.dGrad))
			return q.err
		}))
		e.do(n.ops.Sync())
	} else {
		e.do(n.queueForward(rows))
		e.do(n.queueBackward())
		e.do(n.queueCheck())
		e.do(n.ops.DownloadAsync(n.flagPin[:1], n.ops.Slice(n.flags, 0, 1)))
		e.do(n.ops.Sync())
		e.do(n.ops.Download(flat[:n.nparams], n.dGrad))
	}
	if e.err != nil {
		return 0, -1, fmt.Errorf("engine: forward and backward on %s: %w", n.ops.Name(), e.err)
	}
	n.logitsOK = false
	bad = -1
	if n.flagPin[0] != 0 {
		bad = firstNonFinite(flat[:n.nparams], n.params)
	}
	return n.loss(rows), bad, nil
}

// LayerBounds returns where each layer with parameters starts in the flat
// gradient buffer, in the order backward finishes them (last layer
// first): ForwardBackwardLayers reports these offsets.
func (n *Net) LayerBounds() []int {
	off := make([]int, len(n.params)+1)
	for k, p := range n.params {
		off[k+1] = off[k] + len(p)
	}
	var bounds []int
	for i := len(n.layers) - 1; i >= 0; i-- {
		if ly := n.layers[i]; ly.w >= 0 {
			bounds = append(bounds, off[min(ly.w, ly.b)])
		}
	}
	return bounds
}

// ForwardBackwardLayers is the forward and backward pass handing the
// gradients over as backward produces them: once a layer with parameters
// has its gradients, they are copied into flat beside the rest of
// backward and ready(lo) is called when the copy is done — flat[lo:] then
// holds final values, which the caller may send while the earlier layers
// still compute. Where flat is from FlatBuffer the whole pass is queued
// first, the copies on a stream of their own, so the device never waits
// for the host, and a full batch is replayed from a captured graph
// (Graph) whose copies signal the host as they finish; otherwise each
// layer's copy is waited for before the next layer is queued, call by
// call. It leaves the check for NaN and Inf to the caller, who sees each
// layer's values first. An error from ready stops the pass and is
// returned.
func (n *Net) ForwardBackwardLayers(x []float32, y []int, rows int, flat []float32, ready func(lo int) error) (float32, error) {
	if len(flat) < n.nparams {
		return 0, fmt.Errorf("engine: flat buffer of %d values for %d gradients", len(flat), n.nparams)
	}
	if err := n.begin(x, y, rows); err != nil {
		return 0, err
	}
	fail := func(err error) (float32, error) {
		n.ops.Sync() // no copy may still write flat once the pass has failed
		return 0, fmt.Errorf("engine: forward and backward on %s: %w", n.ops.Name(), err)
	}
	if !n.pinned(flat) {
		readyErr, err := n.layersWaited(rows, flat, ready)
		if err != nil {
			return fail(err)
		}
		if readyErr != nil {
			return 0, readyErr
		}
	} else {
		// queueLayers leaves its copies in n.handovers; a replay leaves
		// the captured ones there.
		if err := n.run(&n.lb, &flat[0], rows == n.batch, func() error { return n.queueLayers(rows, flat) }); err != nil {
			return fail(err)
		}
		for k, h := range n.handovers {
			if err := h.wait(); err != nil {
				return fail(err)
			}
			if err := ready(h.lo); err != nil {
				for _, rest := range n.handovers[k+1:] {
					rest.wait()
				}
				n.ops.Sync()
				return 0, err
			}
		}
	}
	if err := n.ops.Sync(); err != nil {
		return fail(err)
	}
	n.logitsOK = false
	return n.loss(rows), nil
}

// queueLayers queues the whole pass, each layer's gradients copied into
// flat beside the rest (n.handovers) before its input's gradient is
// computed.
func (n *Net) queueLayers(rows int, flat []float32) error {
	n.handovers = n.handovers[:0]
	return n.passLayers(rows, func(lo, hi int) error {
		wait, err := n.ops.DownloadBeside(flat[lo:hi], n.ops.Slice(n.dGrad, lo, hi-lo))
		if err != nil {
			return err
		}
		n.handovers = append(n.handovers, handover{lo, wait})
		return nil
	})
}

// layersWaited is the pass into Go memory: each layer's copy waited for,
// and ready called, before the next layer is queued. It returns ready's
// error, which stops it, apart from the device's.
func (n *Net) layersWaited(rows int, flat []float32, ready func(lo int) error) (readyErr, err error) {
	err = n.passLayers(rows, func(lo, hi int) error {
		var e errs
		e.do(n.ops.Sync())
		e.do(n.ops.Download(flat[lo:hi], n.ops.Slice(n.dGrad, lo, hi-lo)))
		if e.err != nil {
			return e.err
		}
		readyErr = ready(lo)
		return readyErr
	})
	if readyErr != nil {
		return readyErr, nil
	}
	return nil, err
}

// passLayers queues forward and backward, calling hand with each layer's
// part of the gradients, [lo, hi), once backward has queued it and before
// the gradient of the layer's input; an error from hand stops the pass.
func (n *Net) passLayers(rows int, hand func(lo, hi int) error) error {
	if err := n.queueForward(rows); err != nil {
		return err
	}
	if err := n.clearSaved(); err != nil {
		return err
	}
	bounds := n.LayerBounds()
	hi, next := n.nparams, 0
	for i := len(n.layers) - 1; i >= 0; i-- {
		if err := n.backwardParams(i); err != nil {
			return err
		}
		if n.layers[i].w >= 0 {
			lo := bounds[next]
			next++
			if err := hand(lo, hi); err != nil {
				return err
			}
			hi = lo
		}
		if err := n.backwardInput(i); err != nil {
			return err
		}
	}
	return nil
}

// StageGrads sends flat[lo:hi], averaged gradients in the flat buffer from
// FlatBuffer, to the device beside what it computes, for the next
// optimizer step, which then sends only the rest: the replica stages each
// bucket once the ring has averaged it, while later ones still go round.
// Buckets come last tensors first; one that does not extend what is
// staged already towards the front is left for the optimizer step to
// send, and so is everything when flat is not the flat buffer.
func (n *Net) StageGrads(flat []float32, lo, hi int) error {
	if !n.pinned(flat) || lo < 0 || lo > hi || hi != n.nparams-n.staged {
		return nil
	}
	if err := n.ops.UploadBeside(n.ops.Slice(n.dGrad, lo, hi-lo), flat[lo:hi]); err != nil {
		return fmt.Errorf("engine: staging gradients %d to %d on %s: %w", lo, hi, n.ops.Name(), err)
	}
	n.staged = n.nparams - lo
	return nil
}

// queueCheck sets flags[0] to whether the gradients hold a NaN or Inf.
func (n *Net) queueCheck() error {
	flag := n.ops.Slice(n.flags, 0, 1)
	if err := n.ops.Zero(flag); err != nil {
		return err
	}
	return n.ops.NonFinite(n.dGrad, flag)
}

// firstNonFinite returns the index of the first tensor (laid end to end
// in flat with the lengths of like) that holds a NaN or Inf, or -1.
func firstNonFinite(flat []float32, like [][]float32) int {
	o := 0
	for i, t := range like {
		if hasNonFinite(flat[o : o+len(t)]) {
			return i
		}
		o += len(t)
	}
	return -1
}

// hasNonFinite reports whether v holds a NaN or an Inf.
func hasNonFinite(v []float32) bool {
	for _, x := range v {
		if f := float64(x); math.IsNaN(f) || math.IsInf(f, 0) {
			return true
		}
	}
	return false
}

// Forward computes the loss and the logits alone.
func (n *Net) Forward(x []float32, y []int, rows int) (float32, error) {
	if err := n.begin(x, y, rows); err != nil {
		return 0, err
	}
	var e errs
	e.do(n.queueForward(rows))
	e.do(n.ops.Sync())
	if e.err != nil {
		return 0, fmt.Errorf("engine: forward on %s: %w", n.ops.Name(), e.err)
	}
	n.logitsOK = false
	return n.loss(rows), nil
}

func (n *Net) forwardLayer(i int) error {
	ly, x, y, ops := n.layers[i], n.acts[i], n.acts[i+1], n.ops
	switch ly.kind {
	case train.LayerLinear:
		if err := ops.Gemm(false, false, n.batch*ly.rows, ly.outW, ly.inW, x, n.dParams[ly.w], 0, y); err != nil {
			return err
		}
		return ops.BiasAdd(y, n.dParams[ly.b], n.batch*ly.rows, ly.outW, 1)
	case train.LayerEmbedding:
		return ops.Embed(x, n.dParams[ly.w], n.dParams[ly.b], y, n.batch*ly.rows, ly.rows, ly.outW)
	case train.LayerLayerNorm:
		return ops.LayerNorm(x, n.dParams[ly.w], n.dParams[ly.b], y, n.stats[i], n.batch*ly.rows, ly.inW)
	case train.LayerAttention:
		return n.attention(ly, x, n.stats[i], y)
	case train.LayerGELU:
		return ops.GELU(x, y)
	case train.LayerAdd:
		return ops.Add(x, n.acts[n.saves[ly.from].act], y)
	case train.LayerConv2D:
		if p := n.plans[i]; p >= 0 {
			if err := n.ops.(convolver).ConvForward(p, x, n.dParams[ly.w], y); err != nil {
				return err
			}
			return ops.BiasAdd(y, n.dParams[ly.b], n.batch, ly.outC, ly.conv.ColCols())
		}
		// One im2col and one GEMM for the whole batch: the GEMM's output is
		// channel-major (outC × batch·P), turned batch-major with the bias.
		g, P := ly.conv, ly.conv.ColCols()
		col := n.cols[i]
		t := ops.Slice(n.tmp, 0, ly.outC*n.batch*P)
		if err := ops.Im2colBatch(x, col, g, n.batch); err != nil {
			return err
		}
		if err := ops.Gemm(false, false, ly.outC, n.batch*P, g.ColRows(), n.dParams[ly.w], col, 0, t); err != nil {
			return err
		}
		return ops.UnbatchBias(t, n.dParams[ly.b], y, n.batch, ly.outC, P)
	case train.LayerMaxPool2D:
		g := ly.pool
		g.Planes *= n.batch
		return ops.MaxPool(x, y, g)
	case train.LayerReLU:
		return ops.Relu(x, y)
	}
	return nil // flatten
}

// backward turns dActs[i+1] into the layer's parameter gradients and, but
// for the first layer, dActs[i].
func (n *Net) backward(i int) error {
	if err := n.backwardParams(i); err != nil {
		return err
	}
	return n.backwardInput(i)
}

// backwardParams queues layer i's parameter gradients, apart from its
// input's gradient so that ForwardBackwardLayers can hand them over before
// that: for the cnn's first linear layer the input's gradient is a GEMM as
// large as the weights' own, which the ring need not wait for.
func (n *Net) backwardParams(i int) error {
	ly, x, dy, ops := n.layers[i], n.acts[i], n.dActs[i+1], n.ops
	if ly.save >= 0 { // the adds that read this output add their gradients
		if err := ops.Accumulate(dy, n.saves[ly.save].grad); err != nil {
			return err
		}
	}
	switch ly.kind {
	case train.LayerLinear:
		if err := ops.Gemm(true, false, ly.inW, ly.outW, n.batch*ly.rows, x, dy, 0, n.dGrads[ly.w]); err != nil {
			return err
		}
		return ops.BiasGrad(dy, n.dGrads[ly.b], n.batch*ly.rows, ly.outW, 1)
	case train.LayerEmbedding:
		return ops.EmbedGrad(x, dy, n.dGrads[ly.w], n.dGrads[ly.b], n.batch*ly.rows, ly.rows, ly.outW)
	case train.LayerLayerNorm:
		// The gain's and bias's gradients are column sums, of dy·x̂ and of
		// dy: bias_grad's blocks sum a column in a fixed order.
		rows, prod := n.batch*ly.rows, ops.Slice(n.scratch, 0, n.batch*ly.in)
		if err := ops.NormalizedProduct(x, n.stats[i], dy, prod, rows, ly.inW); err != nil {
			return err
		}
		if err := ops.BiasGrad(prod, n.dGrads[ly.w], rows, ly.inW, 1); err != nil {
			return err
		}
		return ops.BiasGrad(dy, n.dGrads[ly.b], rows, ly.inW, 1)
	case train.LayerAdd:
		return ops.Accumulate(n.saves[ly.from].grad, dy)
	case train.LayerConv2D:
		if p := n.plans[i]; p >= 0 {
			if err := ops.BiasGrad(dy, n.dGrads[ly.b], n.batch, ly.outC, ly.conv.ColCols()); err != nil {
				return err
			}
			return n.ops.(convolver).ConvBackwardFilter(p, x, dy, n.dGrads[ly.w])
		}
		g, P := ly.conv, ly.conv.ColCols()
		col := n.cols[i] // forward's im2col of x
		t := ops.Slice(n.tmp, 0, ly.outC*n.batch*P)
		if err := ops.Rebatch(dy, t, n.batch, ly.outC, P); err != nil {
			return err
		}
		// t is outC rows of batch·P: the bias gradient sums each row, and
		// the weight gradient sums over the batch inside one GEMM.
		if err := ops.BiasGrad(t, n.dGrads[ly.b], 1, ly.outC, n.batch*P); err != nil {
			return err
		}
		return ops.Gemm(false, true, ly.outC, g.ColRows(), n.batch*P, t, col, 0, n.dGrads[ly.w])
	}
	return nil
}

// backwardInput queues the gradient of layer i's input, after
// backwardParams(i): a conv2d's reads the rebatched dy that left in tmp.
func (n *Net) backwardInput(i int) error {
	if i == 0 { // the input is the data
		return nil
	}
	ly, x, dy, dx, ops := n.layers[i], n.acts[i], n.dActs[i+1], n.dActs[i], n.ops
	switch ly.kind {
	case train.LayerLinear:
		return ops.Gemm(false, true, n.batch*ly.rows, ly.inW, ly.outW, dy, n.dParams[ly.w], 0, dx)
	case train.LayerLayerNorm:
		return ops.LayerNormBackward(x, n.dParams[ly.w], n.stats[i], dy, dx, n.batch*ly.rows, ly.inW)
	case train.LayerAttention:
		return n.attentionBackward(ly, x, n.stats[i], dy, dx)
	case train.LayerGELU:
		return ops.GELUBackward(x, dy, dx)
	case train.LayerConv2D:
		if p := n.plans[i]; p >= 0 {
			return n.ops.(convolver).ConvBackwardData(p, n.dParams[ly.w], dy, dx)
		}
		g, P := ly.conv, ly.conv.ColCols()
		t := ops.Slice(n.tmp, 0, ly.outC*n.batch*P)
		dCol := ops.Slice(n.dCol, 0, g.ColRows()*n.batch*P)
		if err := ops.Gemm(true, false, g.ColRows(), n.batch*P, ly.outC, n.dParams[ly.w], t, 0, dCol); err != nil {
			return err
		}
		return ops.Col2imBatch(dCol, dx, g, n.batch)
	case train.LayerMaxPool2D:
		g := ly.pool
		g.Planes *= n.batch
		return ops.MaxPoolBackward(x, dy, dx, g)
	case train.LayerReLU:
		return ops.ReluBackward(n.acts[i+1], dy, dx)
	}
	return nil
}

// attention is causal multi-head self-attention from qkv [batch × T,
// 3·C] into y [batch × T, C], keeping the probabilities [batch, heads, T,
// T] in probs: per head, one strided batch of products over the samples.
func (n *Net) attention(ly layer, qkv, probs, y Buf) error {
	T, C, H := ly.rows, ly.outW, ly.heads
	d := C / H
	scale := float32(1 / math.Sqrt(float64(d)))
	at := func(b Buf, off int) Buf { return n.ops.Slice(b, off, b.Len()-off) }
	var e errs
	for h := range H {
		e.do(n.ops.GemmStrided(false, true, T, T, d, scale, at(qkv, h*d), 3*C, T*3*C, at(qkv, C+h*d), 3*C, T*3*C,
			0, at(probs, h*T*T), T, H*T*T, n.batch))
	}
	e.do(n.ops.CausalSoftmax(probs, n.batch*H*T, T))
	for h := range H {
		e.do(n.ops.GemmStrided(false, false, T, d, T, 1, at(probs, h*T*T), T, H*T*T, at(qkv, 2*C+h*d), 3*C, T*3*C,
			0, at(y, h*d), C, T*C, n.batch))
	}
	return e.err
}

// attentionBackward sets dqkv from dy: dV = Pᵀ·dY, dP = dY·Vᵀ, dS = P ⊙
// (dP − rowsum(P ⊙ dP)), dQ = dS·K/√d, dK = dSᵀ·Q/√d.
func (n *Net) attentionBackward(ly layer, qkv, probs, dy, dqkv Buf) error {
	T, C, H := ly.rows, ly.outW, ly.heads
	d := C / H
	scale := float32(1 / math.Sqrt(float64(d)))
	at := func(b Buf, off int) Buf { return n.ops.Slice(b, off, b.Len()-off) }
	dp := n.scratch
	var e errs
	for h := range H {
		p, dph, g := at(probs, h*T*T), at(dp, h*T*T), at(dy, h*d)
		e.do(n.ops.GemmStrided(true, false, T, d, T, 1, p, T, H*T*T, g, C, T*C, 0, at(dqkv, 2*C+h*d), 3*C, T*3*C, n.batch))
		e.do(n.ops.GemmStrided(false, true, T, T, d, 1, g, C, T*C, at(qkv, 2*C+h*d), 3*C, T*3*C, 0, dph, T, H*T*T, n.batch))
	}
	e.do(n.ops.CausalSoftmaxBackward(probs, n.ops.Slice(dp, 0, probs.Len()), n.batch*H*T, T))
	for h := range H {
		dph := at(dp, h*T*T)
		e.do(n.ops.GemmStrided(false, false, T, d, T, scale, dph, T, H*T*T, at(qkv, C+h*d), 3*C, T*3*C, 0, at(dqkv, h*d), 3*C, T*3*C, n.batch))
		e.do(n.ops.GemmStrided(true, false, T, d, T, scale, dph, T, H*T*T, at(qkv, h*d), 3*C, T*3*C, 0, at(dqkv, C+h*d), 3*C, T*3*C, n.batch))
	}
	return e.err
}

// Params returns host copies of the parameters, brought from the device
// if a step changed them since. The caller may write them: the next step
// sends them back first.
func (n *Net) Params() [][]float32 {
	if !n.hostOK && n.err == nil {
		var e errs
		e.do(n.ops.Sync())
		for i, p := range n.params {
			e.do(n.ops.Download(p, n.dParams[i]))
		}
		if e.err != nil {
			// Params cannot fail; the next step does, with this.
			n.err = fmt.Errorf("engine: parameters from %s: %w", n.ops.Name(), e.err)
		} else {
			n.hostOK = true
		}
	}
	n.devOK = false
	return n.params
}

func (n *Net) Grads() [][]float32   { return n.grads }
func (n *Net) ParamNames() []string { return n.names }

// Logits returns the outputs of the last Forward or ForwardBackward (read
// from the device when first asked for after it).
func (n *Net) Logits() []float32 {
	if !n.logitsOK && n.err == nil {
		if err := n.ops.Download(n.logits, n.acts[len(n.acts)-1]); err != nil {
			n.err = fmt.Errorf("engine: logits from %s: %w", n.ops.Name(), err)
		}
		n.logitsOK = true
	}
	return n.logits
}

// Device names the Ops the net runs on, and says so where its
// convolutions are direct (cuDNN on a GPU) rather than by im2col.
func (n *Net) Device() string {
	if n.convs != "" {
		return n.ops.Name() + ", " + n.convs
	}
	return n.ops.Name()
}

// ConvReport is how each direct convolution's algorithms were timed and
// which were kept, where the Ops plans them by timing; else "".
func (n *Net) ConvReport() string {
	if r, ok := n.ops.(interface{ ConvReport() string }); ok {
		return r.ConvReport()
	}
	return ""
}

func (n *Net) Close() error { return n.ops.Close() }
