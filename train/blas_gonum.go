//go:build !netlib

package train

import (
	G "gorgonia.org/gorgonia"

	"github.com/ringtrain/ringtrain/train/gemm"
)

// InstallBLAS makes gorgonia multiply its matrices with this build's BLAS:
// gonum's pure-Go BLAS with train/gemm's packed SGEMM (AVX-512 or AVX2
// assembly) in place of gonum's, which has no register-blocked kernel and
// ran the cnn at a seventh of PyTorch's speed. Its thread budget is
// GOMAXPROCS, which `ringtrain local` sets to the cores divided by the
// peers it starts. gorgonia's BLAS is the process's, so the program calls
// this once, before it builds a model; the layers of our own (linear,
// conv2d) use train/gemm whether or not it is called.
func InstallBLAS() { G.Use(gemm.New(0)) }

// BLAS names the matrix library this build multiplies with.
func BLAS() string { return "ringtrain-gemm/" + gemm.New(0).Kernel() }
