package train

import (
	"github.com/ringtrain/ringtrain/train/gemm"
	"github.com/ringtrain/ringtrain/train/vec"
)

// KernelReport says which kernels training on this machine's CPU uses,
// and why.
type KernelReport struct {
	// GEMM is the matrix products' micro-kernel (the linear layers', and
	// the convolutions' after im2col), GEMMRates the trial it won; each
	// product takes whichever of the kernel's tile shapes (GEMMShapes)
	// pads it least.
	GEMM       string      `json:"gemm"`
	GEMMWhy    string      `json:"gemm_why"`
	GEMMRates  []gemm.Rate `json:"gemm_rates,omitempty"`
	GEMMShapes []string    `json:"gemm_shapes"`
	// Vector is the optimizers', ReLU's, the max-pool's and the conv
	// layers' row copies and sums' kernels.
	Vector    string `json:"vector"`
	VectorWhy string `json:"vector_why"`
	// Conv is how a convolution is computed.
	Conv string `json:"conv"`
}

// Kernels reports this machine's choices; the first call may run the
// matrix kernel's trial (gemm.Chosen).
func Kernels() KernelReport {
	c := gemm.Chosen()
	v, why := vec.Kernel()
	return KernelReport{GEMM: c.Kernel, GEMMWhy: c.Why, GEMMRates: c.Rates, GEMMShapes: c.Shapes(), Vector: v, VectorWhy: why,
		Conv: "im2col sample by sample into a per-thread scratch (a row of ones for the bias), the forward's product taken transposed (positions × filters) where the sum has 64 steps or more; the weight gradient from patches made channels last, summed in 4 fixed groups of samples (one per thread); the input gradient as the patches' gradient, added back channels last and transposed (the only algorithm built)"}
}
