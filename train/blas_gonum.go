//go:build !netlib

package train

// BLAS names the matrix library this build multiplies with: gonum's pure Go
// here; build with -tags netlib for OpenBLAS.
const BLAS = "gonum"
