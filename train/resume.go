package train

import (
	"context"
	"fmt"
)

// Resume brings every rank to the most advanced checkpoint any of them
// holds, so a job whose peers all died carries on where it was, even where
// the machine that wrote the checkpoint is no longer rank 0. Each rank
// passes the checkpoint it found and has already Restored into r, or nil.
// The rank with the most steps (the lowest such rank on a tie) sends its
// parameters, optimizer state and position; the others load them. It
// returns the position to start from and the rank it came from (-1, with
// the zero Position, when no rank had a checkpoint). Every rank must call
// it.
func (r *Replica) Resume(ctx context.Context, c *Checkpoint) (Position, int, error) {
	if c == nil {
		return r.adoptLatest(ctx, false, Position{})
	}
	return r.adoptLatest(ctx, true, Position{Epochs: c.Epoch, Steps: c.Step, Skip: c.Skip})
}

// adoptLatest makes every rank take the parameters, optimizer state and
// position of the rank that offers the most steps (the lowest such rank on
// a tie), among those that offer any (has). It returns that position and
// rank, or the zero Position and -1 when none offers.
func (r *Replica) adoptLatest(ctx context.Context, has bool, mine Position) (Position, int, error) {
	size, rank := r.Coll.Size(), r.Coll.Rank()
	// Who has what: per rank, a flag and its step count in two 16-bit
	// halves (exact in float32), summed from slots that are zero elsewhere.
	const per = 3
	table := make([]float32, per*size)
	if has {
		table[per*rank] = 1
		putInt(table[per*rank+1:], mine.Steps)
	}
	if err := r.Coll.AllreduceSum(ctx, table); err != nil {
		return Position{}, -1, fmt.Errorf("train: comparing checkpoints: %w", err)
	}
	root, best := -1, -1
	for k := range size {
		if table[per*k] != 0 {
			if s := getInt(table[per*k+1:]); s > best {
				root, best = k, s
			}
		}
	}
	if root < 0 {
		return Position{}, -1, nil
	}
	// The position and the optimizer's shape.
	head := make([]float32, 2*5)
	if rank == root {
		_, optStep, state := r.Opt.State()
		for i, v := range []int{mine.Epochs, mine.Steps, mine.Skip, optStep, len(state)} {
			putInt(head[2*i:], v)
		}
	}
	if err := r.Coll.Broadcast(ctx, head, root); err != nil {
		return Position{}, root, fmt.Errorf("train: sending the checkpoint's position: %w", err)
	}
	pos := Position{Epochs: getInt(head[0:]), Steps: getInt(head[2:]), Skip: getInt(head[4:])}
	optStep, nState := getInt(head[6:]), getInt(head[8:])
	params := r.Model.Params()
	// What another rank sends is checked before anything is made from it:
	// an optimizer keeps at most two tensors per parameter (Adam).
	if nState < 0 || nState > 2*len(params) || nState%max(len(params), 1) != 0 || pos.Epochs < 0 || pos.Steps < 0 || pos.Skip < 0 {
		return Position{}, root, fmt.Errorf("train: rank %d sends %d optimizer state tensors for %d parameter tensors, at %+v", root, nState, len(params), pos)
	}
	// Parameters, then every state tensor (each shaped like a parameter).
	if err := r.broadcastTensors(ctx, params, root); err != nil {
		return Position{}, root, fmt.Errorf("train: sending the checkpoint's parameters: %w", err)
	}
	var state [][]float32
	if rank == root {
		_, _, state = r.Opt.State()
	} else {
		for i := range nState {
			state = append(state, make([]float32, len(params[i%len(params)])))
		}
	}
	if err := r.broadcastTensors(ctx, state, root); err != nil {
		return Position{}, root, fmt.Errorf("train: sending the optimizer state: %w", err)
	}
	if rank != root {
		if err := r.Opt.SetState(optStep, state, params); err != nil {
			return Position{}, root, err
		}
	}
	return pos, root, nil
}

// broadcastTensors sends ts from root, one tensor at a time, into the
// same-shaped ts of the others.
func (r *Replica) broadcastTensors(ctx context.Context, ts [][]float32, root int) error {
	for _, t := range ts {
		if err := r.Coll.Broadcast(ctx, t, root); err != nil {
			return err
		}
	}
	return nil
}

// putInt writes a non-negative int below 2^32 as two 16-bit halves, which
// float32 holds exactly.
func putInt(dst []float32, v int) {
	dst[0], dst[1] = float32(v>>16&0xffff), float32(v&0xffff)
}

func getInt(src []float32) int { return int(src[0])<<16 | int(src[1]) }
