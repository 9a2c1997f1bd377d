package vec

import "math"

// MaxPool2 writes 2×2 max-pools, stride 2: for each of rows pairs of
// input rows (x's rows w apart, pair r at rows 2r and 2r+1), ow values
// into y (rows ow apart), each its window's first largest, starting from
// its first (a NaN there stays; a NaN elsewhere is passed over).
func MaxPool2(x []float32, w int, y []float32, ow, rows int) {
	if rows <= 0 || ow <= 0 {
		return
	}
	_ = x[(2*rows-1)*w+2*ow-1]
	_ = y[(rows-1)*ow+ow-1]
	if !maxPool2Asm(x, w, y, ow, rows) {
		maxPool2Go(x, w, y, ow, rows)
	}
}

func maxPool2Go(x []float32, w int, y []float32, ow, rows int) {
	for r := range rows {
		r0, r1 := x[2*r*w:2*r*w+2*ow], x[(2*r+1)*w:(2*r+1)*w+2*ow]
		out := y[r*ow : r*ow+ow]
		for i := range out {
			a := arg4(r0[2*i], r0[2*i+1], r1[2*i], r1[2*i+1])
			out[i] = [4]float32{r0[2*i], r0[2*i+1], r1[2*i], r1[2*i+1]}[a]
		}
	}
}

// MaxPool2Grad writes the gradient of MaxPool2 over the windows' inputs:
// each window's dy at the position of its value, 0 at its other three;
// what lies outside the windows (a last odd row or column) is not
// written.
func MaxPool2Grad(x []float32, w int, dy, dx []float32, ow, rows int) {
	if rows <= 0 || ow <= 0 {
		return
	}
	_ = x[(2*rows-1)*w+2*ow-1]
	_ = dx[(2*rows-1)*w+2*ow-1]
	_ = dy[(rows-1)*ow+ow-1]
	if !maxPool2GradAsm(x, w, dy, dx, ow, rows) {
		maxPool2GradGo(x, w, dy, dx, ow, rows)
	}
}

func maxPool2GradGo(x []float32, w int, dy, dx []float32, ow, rows int) {
	for r := range rows {
		r0, r1 := x[2*r*w:2*r*w+2*ow], x[(2*r+1)*w:(2*r+1)*w+2*ow]
		d0, d1 := dx[2*r*w:2*r*w+2*ow], dx[(2*r+1)*w:(2*r+1)*w+2*ow]
		for i, v := range dy[r*ow : r*ow+ow] {
			a := arg4(r0[2*i], r0[2*i+1], r1[2*i], r1[2*i+1])
			d0[2*i], d0[2*i+1], d1[2*i], d1[2*i+1] = 0, 0, 0, 0
			[2][]float32{d0, d1}[a>>1][2*i+a&1] = v
		}
	}
}

// arg4 is the place (0 to 3; row and column as bits 1 and 0) of a 2×2
// window's value, a b over c d: its first largest, starting from a,
// without branches — which of four is largest is a coin toss that a
// branch predictor loses half the time.
func arg4(a, b, c, d float32) int {
	m := -b2u(b > a) // all ones where b wins
	best := math.Float32bits(b)&m | math.Float32bits(a)&^m
	arg := 1 & m
	m = -b2u(c > math.Float32frombits(best))
	best = math.Float32bits(c)&m | best&^m
	arg = 2&m | arg&^m
	m = -b2u(d > math.Float32frombits(best))
	return int(3&m | arg&^m)
}

// b2u is 1 for true, 0 for false.
func b2u(b bool) uint32 {
	var u uint32
	if b {
		u = 1
	}
	return u
}
