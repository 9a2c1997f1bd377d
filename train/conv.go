package train

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	"gonum.org/v1/gonum/blas"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/ringtrain/ringtrain/train/gemm"
	"github.com/ringtrain/ringtrain/train/vec"
)

// A conv2d layer (stride 1, square kernel, zero padding, bias) as gorgonia
// ops of our own. gorgonia's Conv2d is im2col into a fresh tensor every
// step, a matrix product, a transpose to NCHW and a broadcast add for the
// bias, and on the cnn it spent more time allocating, faulting in and
// shuffling those tensors than multiplying (with OpenBLAS doing the
// products, a cnn step still took 0.37 s: gorgonia's pure-Go im2col,
// transpose and element-wise ops were the bottleneck). These ops
// keep their scratch from step to step, multiply with train/gemm, write
// NCHW directly and add the bias as the product's last step. gorgonia
// still builds the graph and chains the gradients: convOp's SymDiff
// returns the three gradient ops below.
//
// Every sum has a fixed order whatever the thread count — products are
// split by output tiles or samples, never along a sum — so replicas with
// different core budgets compute the same bits.

// convGeom is one layer's shapes: batch b, input c×h×w, o filters of k×k,
// padding pad, output oh×ow.
type convGeom struct {
	b, c, h, w, o, k, pad, oh, ow int
}

func (g convGeom) p() int   { return g.oh * g.ow } // output positions per sample
func (g convGeom) ckk() int { return g.c * g.k * g.k }

// convGroups is how many sums of consecutive samples a conv layer's weight
// gradient is made of: as many threads as that can share the work, and
// the number may not depend on the thread count.
const convGroups = 4

// convState is what a layer's forward op and its gradient ops share:
// scratch that lives as long as the model.
type convState struct {
	g     convGeom
	needX bool // whether the layer's input needs a gradient (not for the first layer)
	blas  *gemm.BLAS
	clock *phaseClock
	// cols are one sample's im2col matrix per thread (ckk × p: row
	// (ci, ky, kx), column position; then a row of ones, for the bias),
	// made just before a product reads it: small enough to stay in cache,
	// where a whole batch's (50 MB for the cnn's second layer) would go
	// to memory and back, which costs more than the products.
	cols [][]float32
	wb   []float32   // W with the bias as a last column, o × (ckk+1)
	dcol [][]float32 // gradX's per-thread scratch: the patches' gradient, p × ckk
	// The forward's W | bias, packed once for every sample: transposed
	// as the product's B (w) where the product is taken transposed, else
	// as its A (wt).
	w  gemm.PackedB
	wt gemm.PackedA
	// dwParts are gradW's group sums, its columns in (ky, kx, ci) order;
	// patches and chLast its per-thread scratch (patchRows).
	dwParts         [][]float32
	patches, chLast [][]float32      // chLast: gradX's per-thread scratch too
	wp              []float32        // gradX's W, its columns in (ky, kx, ci) order
	out             [4]*tensor.Dense // each op's result, by layerKind, reused
}

func newConvState(g convGeom, needX bool, b *gemm.BLAS, clock *phaseClock) *convState {
	return &convState{g: g, needX: needX, blas: b, clock: clock}
}

// scratch returns n matrices of ckk × p, zeroed when made and kept in
// *bufs; what a caller writes stays for its next call.
func (st *convState) scratch(bufs *[][]float32, n int) [][]float32 {
	for len(*bufs) < n {
		*bufs = append(*bufs, make([]float32, st.g.ckk()*st.g.p()))
	}
	return *bufs
}

// colStride is how far apart im2col's rows are: p rounded up to
// gemm.RowMultiple, so that the forward's product reads every strip of
// the matrix in place, the last one included (the columns past p stay
// zero).
func (g convGeom) colStride() int {
	return (g.p() + gemm.RowMultiple - 1) / gemm.RowMultiple * gemm.RowMultiple
}

// forEach is parallelFor over the BLAS's thread budget.
func (st *convState) forEach(n int, f func(t, lo, hi int)) {
	parallelFor(st.blas.Threads(), n, f)
}

// im2col writes sample s's im2col matrix into col (ckk × p, its rows
// colStride apart, so that a product reads it in place). Only the taps that fall
// inside the image are written: the padding's are zeros, the same for
// every sample, left from the matrix's making.
func (st *convState) im2col(col, x []float32, s int) {
	g := st.g
	stride, CKK := g.colStride(), g.ckk()
	for r := range CKK {
		kx, ky, ci := r%g.k, (r/g.k)%g.k, r/(g.k*g.k)
		// Output columns whose input column ox+kx−pad lies inside.
		x0, x1 := max(0, g.pad-kx), min(g.ow, g.w+g.pad-kx)
		if x0 >= x1 {
			continue
		}
		// The output rows whose input row oy+ky−pad lies inside.
		oy0, oy1 := max(0, g.pad-ky), min(g.oh, g.h+g.pad-ky)
		if oy0 < oy1 {
			img := x[(s*g.c+ci)*g.h*g.w : (s*g.c+ci+1)*g.h*g.w]
			vec.CopyRows(col[r*stride+oy0*g.ow+x0:], g.ow, img[(oy0+ky-g.pad)*g.w+x0+kx-g.pad:], g.w, oy1-oy0, x1-x0)
		}
	}
}

// forward: y[s] = W · col(s) + bias, sample by sample, computed as
// (col(s)ᵀ · Wᵀ)ᵀ where the sum is long enough: the cnn's second layer is
// 64 filters × 196 positions, which fills the kernel's tiles (12 × 32)
// far better the other way round.
// The bias is the product's last step: col(s) has a last row of ones and
// Wᵀ the bias as its last row, and a fused multiply-add of 1 · b rounds
// as the sum's own addition of b would — the same bits as adding it after,
// without a pass over y.
func (st *convState) forward(x, w, bias, y []float32) {
	g := st.g
	P, CKK := g.p(), g.ckk()
	stride := g.colStride()
	st.colBufs(max(1, min(st.blas.Threads(), g.b)))
	if len(st.wb) != g.o*(CKK+1) {
		st.wb = make([]float32, g.o*(CKK+1))
	}
	for o := range g.o {
		copy(st.wb[o*(CKK+1):], w[o*CKK:(o+1)*CKK])
		st.wb[o*(CKK+1)+CKK] = bias[o]
	}
	transposed := CKK >= minTransposedDepth
	if transposed {
		st.blas.PackB(&st.w, blas.Trans, CKK+1, g.o, st.wb, CKK+1)
	} else {
		st.blas.PackA(&st.wt, blas.NoTrans, g.o, CKK+1, st.wb, CKK+1)
	}
	st.forEach(g.b, func(t, lo, hi int) {
		col := st.cols[t]
		for s := lo; s < hi; s++ {
			st.im2col(col, x, s)
			ys := y[s*g.o*P : (s+1)*g.o*P]
			if transposed {
				st.blas.SgemmTSerial(blas.Trans, P, col, stride, &st.w, ys, P)
			} else {
				st.blas.SgemmPackedSerial(&st.wt, blas.NoTrans, P, col, stride, 0, ys, P)
			}
		}
	})
}

// colBufs makes sure of n im2col matrices in st.cols, each with its row
// of ones under it.
func (st *convState) colBufs(n int) {
	g := st.g
	P, CKK, stride := g.p(), g.ckk(), g.colStride()
	for len(st.cols) < n {
		col := make([]float32, (CKK+1)*stride)
		for i := range P {
			col[CKK*stride+i] = 1
		}
		st.cols = append(st.cols, col)
	}
}

// chLastBufs makes sure of n samples' worth of channels-last scratch in
// st.chLast (c × h × w values each).
func (st *convState) chLastBufs(n int) {
	for len(st.chLast) < n {
		st.chLast = append(st.chLast, make([]float32, st.g.c*st.g.h*st.g.w))
	}
}

// minTransposedDepth is the shortest sum (ckk) for which the forward's
// product is taken transposed: over fewer steps, writing each tile
// transposed costs more than the fuller tiles save (the cnn's first
// layer, 25 steps, 1.4 → 1.6 ms a batch transposed).
const minTransposedDepth = 64

// gradW: dW = Σ over samples of dy[s] · col(s)ᵀ, summed in convGroups
// groups of consecutive samples, each in order, then the groups' sums in
// order: the groups run on as many threads as there are (each product on
// one), and since their number is fixed the bits are the same whatever
// that is.
//
// col(s)ᵀ is made directly, p × ckk with its columns in (ky, kx, ci)
// order (patches), from the sample transposed to channels last: a
// position's taps for one ky are then k·c values side by side in both,
// one row copy, and the product reads the matrix in place. Made as
// im2col's ckk × p, it would have to be transposed for the product, which
// costs more than making it — except where k·c is short of a vector
// (chLastPatches). Each dW value is the same sum as from im2col's matrix;
// the columns go back to (ci, ky, kx) order at the end.
func (st *convState) gradW(x, dy, dw []float32) {
	g := st.g
	P, CKK := g.p(), g.ckk()
	groups := min(convGroups, g.b)
	threads := max(1, min(st.blas.Threads(), groups))
	patches := st.scratch(&st.patches, threads)
	for len(st.dwParts) < groups {
		st.dwParts = append(st.dwParts, make([]float32, len(dw)))
	}
	chLast := g.chLastPatches()
	if chLast {
		st.chLastBufs(threads)
	} else {
		st.colBufs(threads)
	}
	st.forEach(groups, func(t, lo, hi int) {
		for grp := lo; grp < hi; grp++ {
			for s := grp * g.b / groups; s < (grp+1)*g.b/groups; s++ {
				if chLast {
					st.patchRows(patches[t], st.chLast[t], x, s)
				} else {
					st.im2col(st.cols[t], x, s)
					gemm.Transpose(patches[t], CKK, st.cols[t], g.colStride(), CKK, P)
				}
				beta := float32(1)
				if s == grp*g.b/groups {
					beta = 0
				}
				st.blas.SgemmSerial(blas.NoTrans, blas.NoTrans, g.o, CKK, P, 1, dy[s*g.o*P:], P, patches[t], CKK, beta, st.dwParts[grp], CKK)
			}
		}
	})
	sum := st.dwParts[0]
	for _, part := range st.dwParts[1:groups] {
		vec.AddRows(sum, len(sum), part, len(part), 1, len(sum))
	}
	if !chLast {
		copy(dw, sum)
		return
	}
	kk := g.k * g.k
	for o := range g.o {
		for ci := range g.c {
			for tap := range kk {
				dw[(o*g.c+ci)*kk+tap] = sum[o*CKK+tap*g.c+ci]
			}
		}
	}
}

// chLastPatches reports whether gradW makes its patches channels last
// (patchRows: a position's taps for one ky are k·c values, one row copy)
// or as im2col's matrix transposed, taps in (ci, ky, kx) order: where k·c
// is short of a vector (the first layer: one channel, rows of 5), row
// copies that short cost more than the transpose.
func (g convGeom) chLastPatches() bool { return g.k*g.c >= 16 }

// patchRows writes sample s's patches into rows (p × ckk, each position's
// taps in (ky, kx, ci) order), through xt, the sample channels last
// (h × w × c). Only the taps inside the image are written: the padding's
// are zeros, the same for every sample, left from the matrix's making.
func (st *convState) patchRows(rows, xt, x []float32, s int) {
	g := st.g
	hw := g.h * g.w
	gemm.Transpose(xt, g.c, x[s*g.c*hw:(s+1)*g.c*hw], hw, g.c, hw)
	CKK := g.ckk()
	for oy := range g.oh {
		ky0, ky1 := max(0, g.pad-oy), min(g.k, g.h+g.pad-oy)
		for ox := range g.ow {
			kx0, kx1 := max(0, g.pad-ox), min(g.k, g.w+g.pad-ox)
			if ky0 >= ky1 || kx0 >= kx1 {
				continue
			}
			dst := rows[(oy*g.ow+ox)*CKK+(ky0*g.k+kx0)*g.c:]
			src := xt[((oy+ky0-g.pad)*g.w+ox+kx0-g.pad)*g.c:]
			vec.CopyRows(dst, g.k*g.c, src, g.w*g.c, ky1-ky0, (kx1-kx0)*g.c)
		}
	}
}

// gradB: db[o] = Σ over samples, in order, of each sample's sum over
// positions (vec.Sum's order); filters split over the threads.
func (st *convState) gradB(dy, db []float32) {
	g := st.g
	P := g.p()
	st.forEach(g.o, func(_, lo, hi int) {
		for o := lo; o < hi; o++ {
			sum := float32(0)
			for s := range g.b {
				sum += vec.Sum(dy[(s*g.o+o)*P : (s*g.o+o+1)*P])
			}
			db[o] = sum
		}
	})
}

// gradX: per sample, the patches' gradient dy[s]ᵀ · W (p × ckk, each
// position's taps in (ky, kx, ci) order, as patchRows makes them), then
// each tap's values added back channels last, where a position's c values
// are side by side in both, taps in (ky, kx) order from +0, and the sum
// transposed to c × h × w. Every value is the sum that col2im of
// im2col's matrix Wᵀ · dy[s] makes, in the same order (its taps from +0
// in (ky, kx) order); the product taken this way round fills the
// kernel's tiles (196 positions × 800 taps, where 800 × 196 left an
// eighth of every tile empty).
func (st *convState) gradX(w, dy, dx []float32) {
	g := st.g
	P, CKK, kk, hw := g.p(), g.ckk(), g.k*g.k, g.h*g.w
	threads := max(1, min(st.blas.Threads(), g.b))
	dps := st.scratch(&st.dcol, threads)
	st.chLastBufs(threads)
	if len(st.wp) != len(w) {
		st.wp = make([]float32, len(w))
	}
	for o := range g.o {
		for ci := range g.c {
			for tap := range kk {
				st.wp[o*CKK+tap*g.c+ci] = w[(o*g.c+ci)*kk+tap]
			}
		}
	}
	st.forEach(g.b, func(t, lo, hi int) {
		dp, xt := dps[t], st.chLast[t]
		for s := lo; s < hi; s++ {
			st.blas.SgemmSerial(blas.Trans, blas.NoTrans, P, CKK, g.o, 1, dy[s*g.o*P:], P, st.wp, CKK, 0, dp, CKK)
			clear(xt)
			for tap := range kk {
				ky, kx := tap/g.k, tap%g.k
				x0, x1 := max(0, g.pad-kx), min(g.ow, g.w+g.pad-kx)
				if x0 >= x1 {
					continue
				}
				for oy := max(0, g.pad-ky); oy < min(g.oh, g.h+g.pad-ky); oy++ {
					vec.AddRows(xt[((oy+ky-g.pad)*g.w+x0+kx-g.pad)*g.c:], g.c, dp[(oy*g.ow+x0)*CKK+tap*g.c:], CKK, x1-x0, g.c)
				}
			}
			gemm.Transpose(dx[s*g.c*hw:(s+1)*g.c*hw], hw, xt, g.c, hw, g.c)
		}
	})
}

// The gorgonia ops. Each writes into a tensor it keeps (Do), or one a
// caller preallocated (UsePreallocDo), which stays from run to run.

type convOp struct {
	kind layerKind
	st   *convState
}

var tensor4 = G.TensorType{Dims: 4, Of: hm.TypeVariable('a')}

func (op convOp) Arity() int { return op.kind.arity() }

func (op convOp) Type() hm.Type { return op.kind.fnType(tensor4) }

func (op convOp) shape() tensor.Shape {
	g := op.st.g
	switch op.kind {
	case layerDW:
		return tensor.Shape{g.o, g.c, g.k, g.k}
	case layerDB:
		return tensor.Shape{1, g.o, 1, 1}
	case layerDX:
		return tensor.Shape{g.b, g.c, g.h, g.w}
	}
	return tensor.Shape{g.b, g.o, g.oh, g.ow}
}

func (op convOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.shape(), nil }

// Do writes into a tensor the op keeps: a fresh tensor per step, faulted
// in anew, cost more than the arithmetic. The value is rewritten whole
// each run and nothing holds it past its consumers (gradients are read
// before the next run).
func (op convOp) Do(inputs ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(kept(&op.st.out[op.kind], op.shape()), inputs...)
}

// kept returns *out, made with shape on first use.
func kept(out **tensor.Dense, shape tensor.Shape) *tensor.Dense {
	if *out == nil || !(*out).Shape().Eq(shape) {
		*out = tensor.New(tensor.WithShape(shape.Clone()...), tensor.Of(tensor.Float32))
	}
	return *out
}

func (op convOp) UsePreallocDo(prealloc G.Value, inputs ...G.Value) (G.Value, error) {
	if op.kind != layerFwd {
		op.st.clock.grad()
	}
	data, err := floatsOf(op, op.sizes(), prealloc, inputs)
	if err != nil {
		return nil, err
	}
	st := op.st
	switch op.kind {
	case layerFwd:
		st.forward(data[0], data[1], data[2], data[3])
	case layerDW:
		st.gradW(data[0], data[1], data[2])
	case layerDB:
		st.gradB(data[0], data[1])
	case layerDX:
		st.gradX(data[0], data[1], data[2])
	}
	return prealloc, nil
}

// sizes is how many values each input and the output hold.
func (op convOp) sizes() []int {
	g := op.st.g
	x, w, y := g.b*g.c*g.h*g.w, g.o*g.ckk(), g.b*g.o*g.p()
	switch op.kind {
	case layerDW:
		return []int{x, y, w}
	case layerDB:
		return []int{y, g.o}
	case layerDX:
		return []int{w, y, x}
	}
	return []int{x, w, g.o, y}
}

// floatsOf returns the inputs' and the output's values, refusing any that
// are not float32 or not of the sizes given (inputs, then the output)
// before a loop indexes them: gorgonia has checked shapes; this guards
// the arithmetic.
func floatsOf(op fmt.Stringer, sizes []int, out G.Value, inputs []G.Value) ([][]float32, error) {
	if len(inputs)+1 != len(sizes) {
		return nil, fmt.Errorf("%v: %d inputs, want %d", op, len(inputs), len(sizes)-1)
	}
	data := make([][]float32, len(sizes))
	for i, v := range append(inputs[:len(inputs):len(inputs)], out) {
		d, ok := v.Data().([]float32)
		if !ok {
			return nil, fmt.Errorf("%v: tensor %d holds %T, want []float32", op, i, v.Data())
		}
		if len(d) != sizes[i] {
			return nil, fmt.Errorf("%v: tensor %d has %d values, want %d", op, i, len(d), sizes[i])
		}
		data[i] = d
	}
	return data, nil
}

func (op convOp) ReturnsPtr() bool     { return false }
func (op convOp) CallsExtern() bool    { return true } // so gorgonia's TapeMachine would preallocate our output
func (op convOp) OverwritesInput() int { return -1 }

func (op convOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "ringtrain.%v@%p", op, op.st) }

func (op convOp) Hashcode() uint32 { return hashOf(op) }

func (op convOp) String() string {
	g := op.st.g
	name := [...]string{"conv2d", "conv2dGradW", "conv2dGradB", "conv2dGradX"}[op.kind]
	return fmt.Sprintf("%s<%dx%d, pad %d, %d→%d>", name, g.k, g.k, g.pad, g.c, g.o)
}

func (op convOp) DiffWRT(n int) []bool { return op.kind.diffWRT(op.st.needX, n) }

// SymDiff returns the gradient nodes of x (nil when not needed), w and bias.
func (op convOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if op.kind != layerFwd {
		return nil, fmt.Errorf("%v: no second derivative", op)
	}
	return layerGrads(inputs, grad, op.st.needX, convOp{layerDX, op.st}, convOp{layerDW, op.st}, convOp{layerDB, op.st})
}

// conv2d adds a conv layer to a graph.
func conv2d(x, w, bias *G.Node, g convGeom, needX bool, b *gemm.BLAS, clock *phaseClock) (*G.Node, error) {
	return G.ApplyOp(convOp{layerFwd, newConvState(g, needX, b, clock)}, x, w, bias)
}
