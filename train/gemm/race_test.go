//go:build race

package gemm

// underRace says the tests run under the race detector, where the serial
// kernels' largest exact-bit cases take most of the package's time and
// give the detector nothing to see: one goroutine each.
const underRace = true
