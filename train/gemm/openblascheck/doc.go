// Package openblascheck holds train/gemm's products against OpenBLAS's
// sgemm, an implementation written apart from ours, under the netlib build
// tag (make test-openblas; it needs cgo and Debian's libopenblas-dev). It
// has no code of its own: gemm's assembly cannot share a package with cgo,
// so the check lives beside it.
package openblascheck
