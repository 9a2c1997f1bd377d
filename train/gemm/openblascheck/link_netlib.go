//go:build netlib

package openblascheck

// cgo cannot appear in a test file, so OpenBLAS is linked here.

// #cgo LDFLAGS: -lopenblas
import "C"
