//go:build netlib

package train

// With the netlib tag, gorgonia and tensor multiply matrices with OpenBLAS
// (through gonum's cgo binding) instead of gonum's pure-Go BLAS: the cnn
// trains about 1.7–2.4× faster here (shared/FACTS.md). It needs cgo and
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

func init() { G.Use(netlib.Implementation{}) }
