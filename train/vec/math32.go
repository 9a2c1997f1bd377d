package vec

import "math"

// Float32 functions for the kernels' elementwise layers (GELU, softmax),
// about ten times faster than float64's math.Erf and math.Exp and within
// a few of float32's steps. Every product is rounded on its own (see
// sgdGo): the same bits on every machine, whatever fuses a multiply and
// an add.

// Erf32 is erf(x) within 5·10⁻⁷ (a few of float32's steps near 1): Eigen's
// rational approximation of erf on [−4, 4] (generic_fast_erf_float),
// ±1 beyond, where erf is 1 in float32.
func Erf32(x float32) float32 {
	x = min(max(x, -4), 4)
	x2 := float32(x * x)
	p := float32(x2*-2.72614225801306e-10) + 2.77068142495902e-08
	p = float32(x2*p) + -2.10102402082508e-06
	p = float32(x2*p) + -5.69250639462346e-05
	p = float32(x2*p) + -7.34990630326855e-04
	p = float32(x2*p) + -2.95459980854025e-03
	p = float32(x2*p) + -1.60960333262415e-02
	p = float32(x * p)
	q := float32(x2*-1.45660718464996e-05) + -2.13374055278905e-04
	q = float32(x2*q) + -1.68282697438203e-03
	q = float32(x2*q) + -7.37332916720468e-03
	q = float32(x2*q) + -1.42647390514189e-02
	return p / q
}

// Exp32 is eˣ within 2·10⁻⁷ relative: Cephes' expf, a polynomial on
// x − n·ln 2 scaled by 2ⁿ; 0 below −87.3 and +Inf above 88.7.
func Exp32(x float32) float32 {
	if !(x >= -87.33655 && x <= 88.72283) { // out of range, or NaN
		switch {
		case x > 88.72283:
			return float32(math.Inf(1))
		case x < -87.33655:
			return 0
		}
		return x
	}
	t := float32(x*1.44269504088896341) + 0.5
	ni := int32(t) // floor(t), t's integer part below it where t < 0
	if float32(ni) > t {
		ni--
	}
	n := float32(ni)
	r := x - float32(n*0.693359375)
	r = r - float32(n*-2.12194440e-4)
	p := float32(r*1.9875691500e-4) + 1.3981999507e-3
	p = float32(p*r) + 8.3334519073e-3
	p = float32(p*r) + 4.1665795894e-2
	p = float32(p*r) + 1.6666665459e-1
	p = float32(p*r) + 5.0000001201e-1
	y := float32(float32(p*float32(r*r))+r) + 1
	// y·2ⁿ, n in [−126, 128]: one factor of 2ⁿ built from its exponent
	// bits where it is a normal float32, else two of 2^(n/2).
	if ni > -127 && ni < 128 {
		return float32(y * pow2(ni))
	}
	h := ni / 2
	return float32(float32(y*pow2(h)) * pow2(ni-h))
}

// pow2 is 2ⁿ for n in [−126, 127].
func pow2(n int32) float32 { return math.Float32frombits(uint32(n+127) << 23) }

// ExpSlice sets dst[i] to Exp32(src[i]), bit for bit, 16 lanes at a time
// where the CPU has AVX-512 (dst may be src; it is as long as src).
func ExpSlice(dst, src []float32) {
	dst = dst[:len(src)]
	for i := expAsm(dst, src); i < len(src); i++ {
		dst[i] = Exp32(src[i])
	}
}

// ErfSlice sets dst[i] to Erf32(src[i]), bit for bit, as ExpSlice does.
func ErfSlice(dst, src []float32) {
	dst = dst[:len(src)]
	for i := erfAsm(dst, src); i < len(src); i++ {
		dst[i] = Erf32(src[i])
	}
}

// The GELU's constants, rounded to float32: 1/√2 and 1/√(2π).
const (
	invSqrt2   = float32(0.7071067811865476)
	invSqrt2Pi = float32(0.3989422804014327)
)

// GELU sets out[i] to x[i]·Φ(x[i]) and cdf[i] to Φ(x[i]), Φ the standard
// normal's distribution function, 0.5·(1 + Erf32(x/√2)) — exact GELU, as
// torch's default — in float32 operations each rounded on its own, 16
// lanes at a time where the CPU has AVX-512, bit for bit the scalar loop.
// out and cdf are as long as x.
func GELU(out, cdf, x []float32) {
	out, cdf = out[:len(x)], cdf[:len(x)]
	for i := geluAsm(out, cdf, x); i < len(x); i++ {
		v := x[i]
		c := float32(0.5 * (1 + Erf32(float32(v*invSqrt2))))
		cdf[i], out[i] = c, float32(v*c)
	}
}

// GELUGrad sets dx[i] to dy[i]·(Φ(x[i]) + x[i]·φ(x[i])), the GELU's
// gradient, from the Φ that GELU kept; φ(x) = Exp32(−x²/2)/√(2π). As GELU,
// 16 lanes at a time where it can, bit for bit. dx may be dy.
func GELUGrad(dx, dy, x, cdf []float32) {
	dx, dy, cdf = dx[:len(x)], dy[:len(x)], cdf[:len(x)]
	for i := geluGradAsm(dx, dy, x, cdf); i < len(x); i++ {
		v := x[i]
		pdf := float32(Exp32(float32(-0.5*float32(v*v))) * invSqrt2Pi)
		dx[i] = float32(dy[i] * (cdf[i] + float32(v*pdf)))
	}
}
