package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/ringtrain/ringtrain/train"
)

// Optimizer is a train.SGD or train.Adam run on a Net's device, its state
// (momentum, moments) kept there: a train.DeviceOptimizer. It is bit for
// bit the host optimizer's arithmetic (sgdThread, adamThread), so replicas
// on CPUs and GPUs apply the same updates. The host optimizer it wraps
// holds the hyperparameters and, when State asks, a copy of the state.
//
// With the net's Graph on, its full-batch steps are replayed from a capture
// (a CUDA graph on a GPU); shorter batches run call by call.
// hyperLen is the optimizer's hyperparameters' buffer: Adam's six, and
// AdamW's decay factor at hyperKeep.
const hyperLen, hyperKeep = 8, 6

type Optimizer struct {
	net   *Net
	inner train.Optimizer
	sgd   *train.SGD
	adam  *train.Adam
	decay []bool // AdamW's: the tensors its decoupled decay scales
	adamW bool
	state Buf // SGD: the velocity; Adam: the first moments, then the second
	t     int // Adam's step count
	// hostOK: inner's state tensors hold the device's; devOK: the device
	// holds inner's (false once State or SetState let a caller at them).
	hostOK, devOK bool
	alone, flat   replayer // StepAlone's and StepFlat's
}

var _ train.DeviceOptimizer = (*Optimizer)(nil)

// ErrOptimizer means an optimizer this engine cannot run on its device.
var ErrOptimizer = errors.New("engine: optimizer not supported on the device")

// Optimizer binds opt, a *train.SGD, *train.Adam or *train.AdamW, to the
// net's device.
// Its state memory is allocated now, not in a step.
func (n *Net) Optimizer(opt train.Optimizer) (*Optimizer, error) {
	o := &Optimizer{net: n, inner: opt, hostOK: true}
	size := 0
	switch v := opt.(type) {
	case *train.SGD:
		o.sgd = v
		if v.Momentum != 0 {
			size = n.nparams
		}
	case *train.Adam:
		o.adam = v
		size = 2 * n.nparams
	case *train.AdamW:
		o.adam, o.decay, o.adamW = &v.Adam, v.Decay, true
		size = 2 * n.nparams
	default:
		return nil, fmt.Errorf("%w: %T; want train.SGD, train.Adam or train.AdamW", ErrOptimizer, opt)
	}
	if size > 0 {
		var err error
		if o.state, err = n.ops.Alloc(size); err != nil {
			free, all := n.ops.Free()
			return nil, fmt.Errorf("engine: optimizer state of %.1f MiB on %s (%.1f MiB free of %.1f): %w: %w",
				mib(4*int64(size)), n.ops.Name(), mib(free), mib(all), ErrOutOfMemory, err)
		}
	}
	if err := o.load(); err != nil {
		return nil, err
	}
	return o, nil
}

// load sends inner's state to the device if a caller may have changed it.
func (o *Optimizer) load() error {
	if o.devOK {
		return nil
	}
	_, step, tensors := o.inner.State()
	ops := o.net.ops
	var e errs
	switch {
	case o.state == nil:
	case len(tensors) == 0:
		e.do(ops.Zero(o.state))
	default:
		if want := o.state.Len() / o.net.nparams * len(o.net.params); len(tensors) != want {
			return fmt.Errorf("engine: optimizer state has %d tensors, want %d", len(tensors), want)
		}
		off := 0
		for i, t := range tensors {
			if p := o.net.params[i%len(o.net.params)]; len(t) != len(p) {
				return fmt.Errorf("engine: optimizer state tensor %d has %d values, want %d", i, len(t), len(p))
			}
			e.do(ops.Upload(ops.Slice(o.state, off, len(t)), t))
			off += len(t)
		}
	}
	if e.err != nil {
		return fmt.Errorf("engine: optimizer state to %s: %w", ops.Name(), e.err)
	}
	o.t, o.devOK = step, true
	return nil
}

// fillHyper writes the next update's hyperparameters into pinned memory,
// computed as train.SGD.Step and train.Adam.Step do.
func (o *Optimizer) fillHyper() {
	h := o.net.hyperPin
	if s := o.sgd; s != nil {
		h[0], h[1], h[2] = s.LR, s.Momentum, s.WeightDecay
		return
	}
	a, t := o.adam, o.t+1
	bc1 := 1 - math.Pow(float64(a.Beta1), float64(t))
	bc2 := 1 - math.Pow(float64(a.Beta2), float64(t))
	h[0], h[1], h[2] = a.LR/float32(bc1), float32(math.Sqrt(bc2)), a.WeightDecay
	h[3], h[4], h[5] = a.Beta1, a.Beta2, a.Eps
	if o.adamW { // the decay scales the weights, not the gradients
		h[2], h[hyperKeep] = 0, 1-a.LR*a.WeightDecay
	}
}

// queueUpdate queues the hyperparameters' upload and the update of every
// parameter from dGrad, skipped on the device when skip[0] is not 0.
func (o *Optimizer) queueUpdate(skip Buf) error {
	n, ops := o.net, o.net.ops
	if err := ops.UploadAsync(n.hyper, n.hyperPin); err != nil {
		return err
	}
	if o.sgd != nil {
		v := o.state
		if v == nil {
			v = n.ops.Slice(n.flags, 1, 0)
		}
		return ops.SGD(n.dParam, n.dGrad, v, n.hyper, skip)
	}
	for i, d := range o.decay {
		if d && i < len(n.dParams) {
			if err := ops.Scale(n.dParams[i], n.hyper, hyperKeep, skip); err != nil {
				return err
			}
		}
	}
	return ops.Adam(n.dParam, n.dGrad, ops.Slice(o.state, 0, n.nparams), ops.Slice(o.state, n.nparams, n.nparams), n.hyper, skip)
}

// applied records a step taken on the device.
func (o *Optimizer) applied() {
	o.t++
	o.hostOK = false
	o.net.updated()
}

// ready brings parameters and state to the device.
func (o *Optimizer) ready() error {
	if err := o.net.ensureDevice(); err != nil {
		return err
	}
	return o.load()
}

// StepFlat applies the update from gradients laid end to end (the
// replica's averaged flat buffer), unless they hold a NaN or an Inf: it
// checks them on the device, where the check costs next to nothing, and
// says whether they were finite.
func (o *Optimizer) StepFlat(grads []float32) (bool, error) {
	n := o.net
	if len(grads) != n.nparams {
		return false, fmt.Errorf("engine: %d gradient values for %d parameters", len(grads), n.nparams)
	}
	if err := o.ready(); err != nil {
		return false, err
	}
	o.fillHyper()
	flag := n.ops.Slice(n.flags, 2, 1)
	queue := func() error {
		var q errs
		q.do(n.ops.Zero(flag))
		q.do(n.ops.NonFinite(n.dGrad, flag))
		q.do(o.queueUpdate(flag))
		q.do(n.ops.DownloadAsync(n.flagPin[2:3], flag))
		return q.err
	}
	var e errs
	staged := n.staged
	n.staged = 0
	switch {
	case staged > 0 && n.pinned(grads):
		// The staged part is on its way (Sync waits for it); the rest goes
		// now, call by call, since a captured graph copies all.
		e.do(n.ops.Sync())
		e.do(n.ops.UploadAsync(n.ops.Slice(n.dGrad, 0, n.nparams-staged), grads[:n.nparams-staged]))
		e.do(queue())
	case n.pinned(grads):
		e.do(n.run(&o.flat, &grads[0], true, func() error {
			if err := n.ops.UploadAsync(n.dGrad, grads); err != nil {
				return err
			}
			return queue()
		}))
	default:
		e.do(n.ops.Upload(n.dGrad, grads))
		e.do(queue())
	}
	e.do(n.ops.Sync())
	if e.err != nil {
		return false, fmt.Errorf("engine: optimizer step on %s: %w", n.ops.Name(), e.err)
	}
	if n.flagPin[2] != 0 {
		return false, nil
	}
	o.applied()
	return true, nil
}

// StepAlone is a whole step for a ring of one: the batch in, forward,
// backward, the NaN/Inf check and the update on the device (skipped there
// if the check fails), the loss and the check's flag out, and one wait.
func (o *Optimizer) StepAlone(x []float32, y []int, rows int) (loss float32, bad int, err error) {
	n := o.net
	if err := o.load(); err != nil {
		return 0, -1, err
	}
	if err := n.begin(x, y, rows); err != nil {
		return 0, -1, err
	}
	o.fillHyper()
	queue := func() error {
		var e errs
		e.do(n.queueForward(rows))
		e.do(n.queueBackward())
		e.do(n.queueCheck())
		e.do(o.queueUpdate(n.ops.Slice(n.flags, 0, 1)))
		e.do(n.ops.DownloadAsync(n.flagPin[:1], n.ops.Slice(n.flags, 0, 1)))
		return e.err
	}
	err = n.run(&o.alone, nil, rows == n.batch, queue)
	if err == nil {
		err = n.ops.Sync()
	}
	if err != nil {
		return 0, -1, fmt.Errorf("engine: training step on %s: %w", n.ops.Name(), err)
	}
	n.logitsOK = false
	if n.flagPin[0] != 0 { // rare: find the tensor to name
		bad := 0
		for i, g := range n.dGrads {
			if err := n.ops.Download(n.grads[i], g); err != nil {
				return 0, -1, fmt.Errorf("engine: gradients from %s: %w", n.ops.Name(), err)
			}
			if hasNonFinite(n.grads[i]) {
				bad = i
				break
			}
		}
		return n.loss(rows), bad, nil
	}
	o.applied()
	return n.loss(rows), -1, nil
}

// Step applies the update from host gradients, in the order of the net's
// Params (as train.Optimizer asks; the replica uses StepFlat). params must
// be the net's own. Step cannot return an error: a failure is kept and
// returned by the net's next call.
func (o *Optimizer) Step(params, grads [][]float32) {
	n := o.net
	if len(params) != len(n.params) || len(params) > 0 && len(params[0]) > 0 && &params[0][0] != &n.params[0][0] {
		n.err = errors.New("engine: a device optimizer steps only its own net's parameters")
		return
	}
	if len(grads) != len(n.params) {
		n.err = fmt.Errorf("engine: %d gradient tensors for %d parameters", len(grads), len(n.params))
		return
	}
	flat := make([]float32, 0, n.nparams)
	for i, g := range grads {
		if len(g) != len(n.params[i]) {
			n.err = fmt.Errorf("engine: gradient %s has %d values, want %d", n.names[i], len(g), len(n.params[i]))
			return
		}
		flat = append(flat, g...)
	}
	if _, err := o.StepFlat(flat); err != nil {
		n.err = err
	}
}

// State returns the host optimizer's state, brought from the device first
// if steps changed it. The caller may write it: the next step sends it back.
func (o *Optimizer) State() (string, int, [][]float32) {
	if !o.hostOK && o.state != nil && o.net.err == nil {
		n := o.net
		per := o.state.Len() / n.nparams
		tensors := make([][]float32, 0, per*len(n.params))
		var e errs
		e.do(n.ops.Sync())
		off := 0
		for range per {
			for _, p := range n.params {
				t := make([]float32, len(p))
				e.do(n.ops.Download(t, n.ops.Slice(o.state, off, len(p))))
				tensors = append(tensors, t)
				off += len(p)
			}
		}
		e.do(o.inner.SetState(o.t, tensors, n.params))
		if e.err != nil {
			n.err = fmt.Errorf("engine: optimizer state from %s: %w", n.ops.Name(), e.err)
		}
	}
	o.hostOK, o.devOK = true, false
	return o.inner.State()
}

// SetState restores state, on the host now and on the device before the
// next step.
func (o *Optimizer) SetState(step int, tensors, params [][]float32) error {
	if err := o.inner.SetState(step, tensors, params); err != nil {
		return err
	}
	o.hostOK, o.devOK = true, false
	return nil
}

// SetLR changes the learning rate; a captured step reads it from pinned
// memory, so it holds from the next step on.
func (o *Optimizer) SetLR(lr float32) { o.inner.SetLR(lr) }
