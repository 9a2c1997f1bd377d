//go:build netlib

package train

// With the netlib tag, gorgonia and tensor multiply matrices with OpenBLAS
// (through gonum's cgo binding) instead of train/gemm. The built-in layers
// (linear, conv2d) are our own ops and use train/gemm in every build, so
// this changes only the products gorgonia computes itself. It needs cgo and
// Debian's libopenblas-dev; the linker flag below is why CGO_LDFLAGS need
// not be set by hand. Set OPENBLAS_NUM_THREADS to the cores a process may use.

// #cgo LDFLAGS: -lopenblas
import "C"

import (
	"gonum.org/v1/netlib/blas/netlib"
	G "gorgonia.org/gorgonia"
)

// BLAS names the matrix library this build multiplies with.
func BLAS() string { return "openblas" }

// InstallBLAS makes gorgonia multiply its matrices with OpenBLAS. gorgonia's
// BLAS is the process's, so the program calls this once, before it builds
// a model.
func InstallBLAS() { G.Use(netlib.Implementation{}) }
