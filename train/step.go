package train

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"unsafe"
)

// Collective is what a training step needs of a ring. *ring.Ring has it;
// so does a ring of one.
type Collective interface {
	AllreduceMean(ctx context.Context, buf []float32) error
	AllreduceSum(ctx context.Context, buf []float32) error
	Broadcast(ctx context.Context, buf []float32, root int) error
	Rank() int
	Size() int
}

// ErrNonFinite means a gradient had a NaN or an Inf on some rank; every rank
// skips that step together.
var ErrNonFinite = errors.New("train: non-finite gradient")

// Replica is one rank's copy of the model, kept in step with the others:
// after every backward pass its gradients are averaged over the ring before
// the optimizer applies them, so every replica applies the same bits.
type Replica struct {
	Model Model
	Opt   Optimizer
	Coll  Collective

	// flat holds every gradient (or, to broadcast, parameter) tensor end
	// to end, then one flag.
	flat []float32
}

// NewReplica wires a model, an optimizer and a collective.
func NewReplica(m Model, opt Optimizer, c Collective) *Replica {
	n := 0
	for _, p := range m.Params() {
		n += len(p)
	}
	return &Replica{Model: m, Opt: opt, Coll: c, flat: make([]float32, n+1)} // +1: the non-finite flag
}

// SyncParams makes every replica start from rank 0's parameters.
func (r *Replica) SyncParams(ctx context.Context) error {
	params := r.flat[:len(r.flat)-1]
	gather(params, r.Model.Params())
	if err := r.Coll.Broadcast(ctx, params, 0); err != nil {
		return fmt.Errorf("train: broadcasting parameters: %w", err)
	}
	scatter(r.Model.Params(), params)
	return nil
}

// Step trains on one local batch: forward and backward, gradients averaged
// over the ring, optimizer step. It returns the local loss.
//
// A NaN or Inf gradient on any rank would poison every replica, so each rank
// appends a flag to its gradients — 1 if any of its own is not finite — and
// the one allreduce that averages them also tells every rank whether any
// rank was bad. Nothing is applied then: every rank skips the step, and Step
// returns an error wrapping ErrNonFinite that says how many ranks were bad
// and, for this rank, which tensor.
func (r *Replica) Step(ctx context.Context, x []float32, y []int, n int) (float32, error) {
	loss, err := r.Model.ForwardBackward(x, y, n)
	if err != nil {
		return 0, err
	}
	grads := r.Model.Grads()
	bad := firstNonFinite(grads)
	flag := len(r.flat) - 1
	gather(r.flat, grads)
	r.flat[flag] = 0
	if bad >= 0 {
		r.flat[flag] = 1
	}
	if err := r.Coll.AllreduceMean(ctx, r.flat); err != nil {
		return 0, fmt.Errorf("train: averaging gradients: %w", err)
	}
	if badRanks := int(math.Round(float64(r.flat[flag]) * float64(r.Coll.Size()))); badRanks > 0 {
		where := "its own are finite"
		if bad >= 0 {
			where = "its " + r.Model.ParamNames()[bad] + " gradient is not"
		}
		return loss, fmt.Errorf("train: %d of %d ranks had NaN or Inf gradients (rank %d: %s); step skipped on all: %w",
			badRanks, r.Coll.Size(), r.Coll.Rank(), where, ErrNonFinite)
	}
	scatter(grads, r.flat)
	r.Opt.Step(r.Model.Params(), grads)
	return loss, nil
}

// Snapshot fills a checkpoint's parameters and optimizer state with
// copies of the replica's; base supplies the rest.
func (r *Replica) Snapshot(base Checkpoint) *Checkpoint {
	c := base
	c.Params = nil
	for _, p := range r.Model.Params() {
		c.Params = append(c.Params, slices.Clone(p))
	}
	name, step, state := r.Opt.State()
	c.Optimizer, c.OptStep, c.OptState = name, step, nil
	for _, t := range state {
		c.OptState = append(c.OptState, slices.Clone(t))
	}
	return &c
}

// Restore loads a checkpoint's parameters and optimizer state, refusing
// one of another model or optimizer.
func (r *Replica) Restore(c *Checkpoint) error {
	if err := c.LoadInto(r.Model); err != nil {
		return err
	}
	if name, _, _ := r.Opt.State(); name != c.Optimizer {
		return fmt.Errorf("train: checkpoint was made with %s, this run uses %s: %w", c.Optimizer, name, ErrCheckpoint)
	}
	return r.Opt.SetState(c.OptStep, c.OptState, r.Model.Params())
}

// ParamHash is the SHA-256 of the parameters' bytes, to compare replicas.
func (r *Replica) ParamHash() [32]byte {
	h := sha256.New()
	for _, p := range r.Model.Params() {
		if len(p) > 0 {
			h.Write(unsafe.Slice((*byte)(unsafe.Pointer(&p[0])), 4*len(p)))
		}
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// CheckInSync compares every rank's parameter hash through the collective
// and names the ranks that differ from rank 0.
func (r *Replica) CheckInSync(ctx context.Context) error {
	size, rank := r.Coll.Size(), r.Coll.Rank()
	hash := r.ParamHash()
	// Each rank puts 128 bits of its hash, as 16-bit pieces, in its own
	// slot; the others hold zeros, so the sum is exact in float32.
	const pieces = 8
	table := make([]float32, pieces*size)
	for i := range pieces {
		table[pieces*rank+i] = float32(binary.LittleEndian.Uint16(hash[2*i:]))
	}
	if err := r.Coll.AllreduceSum(ctx, table); err != nil {
		return fmt.Errorf("train: comparing parameter hashes: %w", err)
	}
	var differ []int
	for k := 1; k < size; k++ {
		for i := range pieces {
			if table[pieces*k+i] != table[i] {
				differ = append(differ, k)
				break
			}
		}
	}
	if len(differ) > 0 {
		return fmt.Errorf("train: replicas out of step: ranks %v hold other parameters than rank 0", differ)
	}
	return nil
}

func firstNonFinite(ts [][]float32) int {
	for i, t := range ts {
		for _, v := range t {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return i
			}
		}
	}
	return -1
}

func gather(flat []float32, ts [][]float32) {
	o := 0
	for _, t := range ts {
		o += copy(flat[o:], t)
	}
}

func scatter(ts [][]float32, flat []float32) {
	o := 0
	for _, t := range ts {
		o += copy(t, flat[o:])
	}
}
