package vec

// The softmax's row operations: a row's largest value, a constant added
// to or multiplied into a row, and the softmax gradient's p·(d − c) —
// element by element, each rounded on its own, so 16 lanes at a time
// (where the CPU has AVX-512) give the scalar loop's bits.

// Max is the largest of x, which holds at least one value. NaNs are not
// ordered: with one in x the result may or may not be NaN (a softmax of
// such a row is NaN all the same).
func Max(x []float32) float32 {
	m, i := maxAsm(x)
	if i == 0 {
		m = x[0]
	}
	for ; i < len(x); i++ {
		if x[i] > m {
			m = x[i]
		}
	}
	return m
}

// AddScalar sets dst[i] to src[i] + c (dst may be src; it is as long as
// src).
func AddScalar(dst, src []float32, c float32) {
	dst = dst[:len(src)]
	for i := addScalarAsm(dst, src, c); i < len(src); i++ {
		dst[i] = src[i] + c
	}
}

// Scale sets dst[i] to src[i]·c, as AddScalar does.
func Scale(dst, src []float32, c float32) {
	dst = dst[:len(src)]
	for i := scaleAsm(dst, src, c); i < len(src); i++ {
		dst[i] = src[i] * c
	}
}

// MulSub sets d[i] to p[i]·(d[i] − c), the difference rounded before the
// product (p is at least as long as d).
func MulSub(d, p []float32, c float32) {
	p = p[:len(d)]
	for i := mulSubAsm(d, p, c); i < len(d); i++ {
		d[i] = p[i] * float32(d[i]-c)
	}
}
