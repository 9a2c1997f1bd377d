package vec

import "golang.org/x/sys/cpu"

// hasAVX512 is read once; the CPU does not change under a process.
var hasAVX512 = cpu.X86.HasAVX512F

// sgdMomentumAsm updates the first multiple of 16 values of p with
// AVX-512 and returns how many it did (0 without AVX-512).
func sgdMomentumAsm(p, g, v []float32, lr, mu, wd float32) int {
	n := len(p) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	sgdMomentum16(&p[0], &g[0], &v[0], n, lr, mu, wd)
	return n
}

// adamAsm is sgdMomentumAsm's counterpart for Adam.
func adamAsm(p, g, m, v []float32, c *AdamConsts) int {
	n := len(p) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	adam16(&p[0], &g[0], &m[0], &v[0], n, c)
	return n
}

//go:noescape
func sgdMomentum16(p, grad, v *float32, n int, lr, mu, wd float32)

//go:noescape
func adam16(p, grad, m, v *float32, n int, c *AdamConsts)

func reluAsm(x, y []float32) int {
	n := len(x) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	relu16(&x[0], &y[0], n)
	return n
}

func reluGradAsm(y, dy, dx []float32) int {
	n := len(y) &^ 15
	if !hasAVX512 || n == 0 {
		return 0
	}
	reluGrad16(&y[0], &dy[0], &dx[0], n)
	return n
}

//go:noescape
func relu16(x, y *float32, n int)

//go:noescape
func reluGrad16(y, dy, dx *float32, n int)
