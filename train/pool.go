package train

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
	"github.com/ringtrain/ringtrain/train/vec"
)

// poolOp is a k×k max-pool with stride k and no padding, over a b × c × h
// × w tensor, as a gorgonia op that writes into an output it keeps.
// gorgonia's MaxPool2D walks every window through a general loop with
// padding and a mask of ints: an eighth of the cnn's step.
//
// A window's value is its first largest (scanned row by row) starting
// from its first value, as the engine's maxpool does, so a NaN at a
// window's start stays NaN (the step's finite check sees it) and a
// window of −Inf gives −Inf. grad: (x, dy) → dx, each window's gradient
// to the position of its value and 0 elsewhere (torch's choice for ties),
// found again from x rather than kept from the forward run, which may have
// been of other data.
type poolOp struct {
	pairOp
	g poolGeom
}

// poolGeom is a max-pool's shapes: b·c planes of h × w, a k × k window,
// output h/k × w/k.
type poolGeom struct{ b, c, h, w, k int }

func (g poolGeom) oh() int { return g.h / g.k }
func (g poolGeom) ow() int { return g.w / g.k }

func (op poolOp) Type() hm.Type { return op.fnType(tensor4) }

func (op poolOp) shape() tensor.Shape {
	g := op.g
	if op.grad {
		return tensor.Shape{g.b, g.c, g.h, g.w}
	}
	return tensor.Shape{g.b, g.c, g.oh(), g.ow()}
}

func (op poolOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.shape(), nil }

func (op poolOp) Do(inputs ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(kept(op.out, op.shape()), inputs...)
}

func (op poolOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	g := op.g
	x, y := g.b*g.c*g.h*g.w, g.b*g.c*g.oh()*g.ow()
	if !op.grad {
		data, err := floatsOf(op, []int{x, y}, prealloc, inputs)
		if err != nil {
			return nil, err
		}
		op.planesEach(func(lo, hi int) { maxPool(op.part(lo, hi), op.planes(data[0], lo, hi), op.outPlanes(data[1], lo, hi)) })
		return prealloc, nil
	}
	data, err := floatsOf(op, []int{x, y, x}, prealloc, inputs)
	if err != nil {
		return nil, err
	}
	op.planesEach(func(lo, hi int) {
		maxPoolGrad(op.part(lo, hi), op.planes(data[0], lo, hi), op.outPlanes(data[1], lo, hi), op.planes(data[2], lo, hi))
	})
	return prealloc, nil
}

// planesEach runs f over the b·c planes in parts (pairOp.each).
func (op poolOp) planesEach(f func(lo, hi int)) {
	g := op.g
	op.each(g.b*g.c, g.b*g.c*g.h*g.w, f)
}

// part is the geometry of planes [lo, hi), as one sample of hi − lo
// channels.
func (op poolOp) part(lo, hi int) poolGeom {
	g := op.g
	g.b, g.c = 1, hi-lo
	return g
}

// planes and outPlanes are planes [lo, hi) of an input-shaped and an
// output-shaped tensor.
func (op poolOp) planes(x []float32, lo, hi int) []float32 {
	return x[lo*op.g.h*op.g.w : hi*op.g.h*op.g.w]
}

func (op poolOp) outPlanes(y []float32, lo, hi int) []float32 {
	return y[lo*op.g.oh()*op.g.ow() : hi*op.g.oh()*op.g.ow()]
}

// maxPool writes each window's value of x into y.
func maxPool(g poolGeom, x, y []float32) {
	oh, ow := g.oh(), g.ow()
	for p := range g.b * g.c {
		plane := x[p*g.h*g.w : (p+1)*g.h*g.w]
		out := y[p*oh*ow : (p+1)*oh*ow]
		if g.k == 2 {
			vec.MaxPool2(plane, g.w, out, ow, oh)
			continue
		}
		for oy := range oh {
			for ox := range ow {
				out[oy*ow+ox] = plane[windowArg(g, plane, oy, ox)]
			}
		}
	}
}

// maxPoolGrad writes dx: dy of each window at its value's position, 0
// elsewhere (and where no window reaches).
func maxPoolGrad(g poolGeom, x, dy, dx []float32) {
	oh, ow := g.oh(), g.ow()
	if g.k != 2 || g.h%2 != 0 || g.w%2 != 0 {
		clear(dx) // vec.MaxPool2Grad writes every input of a window and only those
	}
	for p := range g.b * g.c {
		plane := x[p*g.h*g.w : (p+1)*g.h*g.w]
		d := dy[p*oh*ow : (p+1)*oh*ow]
		out := dx[p*g.h*g.w : (p+1)*g.h*g.w]
		if g.k == 2 {
			vec.MaxPool2Grad(plane, g.w, d, out, ow, oh)
			continue
		}
		for oy := range oh {
			for ox := range ow {
				out[windowArg(g, plane, oy, ox)] = d[oy*ow+ox]
			}
		}
	}
}

// windowArg is the index in plane of window (oy, ox)'s value: its first
// largest, starting from its first.
func windowArg(g poolGeom, plane []float32, oy, ox int) int {
	at := oy*g.k*g.w + ox*g.k
	arg, best := at, plane[at]
	for ky := range g.k {
		row := at + ky*g.w
		for kx, v := range plane[row : row+g.k] {
			if v > best {
				arg, best = row+kx, v
			}
		}
	}
	return arg
}

func (op poolOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "ringtrain.%v@%p", op, op.out) }

func (op poolOp) Hashcode() uint32 { return hashOf(op) }

func (op poolOp) String() string {
	name := "maxpool2d"
	if op.grad {
		name = "maxpool2dGrad"
	}
	return fmt.Sprintf("%s<%dx%d, %dx%d>", name, op.g.k, op.g.k, op.g.h, op.g.w)
}

func (op poolOp) SymDiff(inputs G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	if op.grad || len(inputs) != 1 {
		return nil, fmt.Errorf("%v: no second derivative", op)
	}
	dx, err := G.ApplyOp(poolOp{pairOp{grad: true, out: new(*tensor.Dense), blas: op.blas}, op.g}, inputs[0], grad)
	return G.Nodes{dx}, err
}

// maxPool2d adds a k×k max-pool with stride k to a graph, split over b's
// threads (nil: one); x is b × c × h × w.
func maxPool2d(x *G.Node, g poolGeom, b *gemm.BLAS) (*G.Node, error) {
	return G.ApplyOp(poolOp{pairOp{out: new(*tensor.Dense), blas: b}, g}, x)
}
