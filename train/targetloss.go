package train

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"
)

// targetLoss is MSE or BCE of outputs against float targets (both rows ×
// K) as one kernel, a 1×1 matrix: the sum over the first *live rows of
// each row's loss, times *scale (1/n for the batch's n samples) and 1/K.
// Rows past *live are a short batch's padding and add nothing, neither to
// the loss nor to the gradient.
type targetLoss struct {
	loss  Loss
	k     int
	scale *float32
	live  *int
}

func (t targetLoss) String() string { return string(t.loss) }

func (t targetLoss) shape(in []tensor.Shape) (tensor.Shape, error) {
	if len(in[0]) != 2 || in[0][1] != t.k || !in[0].Eq(in[1]) {
		return nil, fmt.Errorf("%v: outputs %v and targets %v; want matrices of one shape, %d wide", t, in[0], in[1], t.k)
	}
	return tensor.Shape{1, 1}, nil
}

// bceFloor is where torch's BCELoss holds each log, so that an output of
// exactly 0 or 1 costs 100, not infinity.
const bceFloor = -100

// bceEps is torch's floor on p·(1−p) in BCELoss's gradient.
const bceEps = 1e-12

func (t targetLoss) forward(out []float32, in [][]float32) error {
	p, y := in[0], in[1]
	n := min(*t.live*t.k, len(p))
	var total float64 // in row order
	for i, v := range p[:n] {
		switch t.loss {
		case MSE:
			d := float64(v) - float64(y[i])
			total += d * d
		case BCE:
			lp := max(math.Log(float64(v)), bceFloor)
			lq := max(math.Log(1-float64(v)), bceFloor)
			total -= float64(y[i])*lp + (1-float64(y[i]))*lq
		}
	}
	out[0] = float32(total/float64(t.k)) * *t.scale
	return nil
}

func (t targetLoss) backward(dx [][]float32, dy []float32, in [][]float32, _ []float32) error {
	p, y, d := in[0], in[1], dx[0]
	n := min(*t.live*t.k, len(p))
	g := float64(dy[0]) * float64(*t.scale) / float64(t.k)
	for i, v := range p[:n] {
		switch t.loss {
		case MSE:
			d[i] = float32(2 * g * (float64(v) - float64(y[i])))
		case BCE:
			d[i] = float32(g * (float64(v) - float64(y[i])) / max((1-float64(v))*float64(v), bceEps))
		}
	}
	clear(d[n:])
	return nil
}

// loadTargets copies the targets of n rows of x (each features then k
// targets, row values wide) into ys, n × k, and zeros after them.
func loadTargets(ys, x []float32, n, row, k int) {
	for r := range n {
		copy(ys[r*k:(r+1)*k], x[r*row+row-k:(r+1)*row])
	}
	clear(ys[n*k:])
}

// loadFeatures copies the features of n rows of x (each row values wide,
// features first) into xs, and zeros after them.
func loadFeatures(xs, x []float32, n, row, features int) {
	if row == features {
		copy(xs, x[:n*row])
	} else {
		for r := range n {
			copy(xs[r*features:(r+1)*features], x[r*row:r*row+features])
		}
	}
	clear(xs[n*features:])
}
