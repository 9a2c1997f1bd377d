//go:build !race

package gemm

// underRace says the tests run under the race detector.
const underRace = false
