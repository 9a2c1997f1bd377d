//go:build !amd64

package vec

// Kernel names the optimizers' and ReLU's kernels on this CPU, and says
// why: Go loops, which the compiler may vectorize.
func Kernel() (name, why string) { return "go", "no assembly for this architecture: Go loops" }

func sgdMomentumAsm(p, g, v []float32, lr, mu, wd float32) int { return 0 }

func adamAsm(p, g, m, v []float32, c *AdamConsts) int { return 0 }

func reluAsm(x, y []float32) int { return 0 }

func reluGradAsm(y, dy, dx []float32) int { return 0 }

func finiteAsm(x []float32) (int, bool) { return 0, true }

func copyFiniteAsm(dst, src []float32) (int, bool) { return 0, true }

func sumAsm(x []float32) (float32, bool) { return 0, false }

func sumSquaresAsm(x []float32) (float32, bool) { return 0, false }

func sketchScanAsm(dst, src []float32, signs []uint64, buckets []int32, lanes []float32, sq *[16]float32, n int) bool {
	return false
}

func rowsAsm(add bool, dst []float32, ldd int, src []float32, lds int, rows, n int) bool {
	return false
}

func maxPool2Asm(x []float32, w int, y []float32, ow, rows int) bool { return false }

func maxPool2GradAsm(x []float32, w int, dy, dx []float32, ow, rows int) bool { return false }

func expAsm(dst, src []float32) int { return 0 }

func erfAsm(dst, src []float32) int { return 0 }

func geluAsm(out, cdf, x []float32) int { return 0 }

func geluGradAsm(dx, dy, x, cdf []float32) int { return 0 }

func maxAsm(x []float32) (float32, int) { return 0, 0 }

func addScalarAsm(dst, src []float32, c float32) int { return 0 }

func scaleAsm(dst, src []float32, c float32) int { return 0 }

func mulSubAsm(d, p []float32, c float32) int { return 0 }
