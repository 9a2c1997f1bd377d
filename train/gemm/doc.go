// Package gemm multiplies float32 matrices fast enough for the CPU engine:
// a packed, register-blocked SGEMM whose inner kernel is AVX-512 or AVX2
// assembly on amd64, a Go loop the compiler fuses into FMA instructions on
// arm64, ppc64, s390x and riscv64, and an exact Go kernel elsewhere,
// offered as a gonum blas.Float32 so gorgonia (through G.Use) and gonum's
// tensor code multiply with it.
//
// Every kernel computes each element of the product the same way: one
// fused multiply-add per k, in order of k, from zero, then alpha and beta
// applied once. So the result is the same bits whichever kernel the CPU
// gets, whichever tile shape a product takes (AVX-512 has 12 × 32 and
// 8 × 48; each product takes the one that pads it least), however many
// threads share the work and however the work is cut (a product taken k
// in blocks goes on from C's sums) —
// the property replicas of one job rely on when they compare parameter
// hashes. The exact Go kernel gets a correctly rounded float32 FMA from
// float64 arithmetic with round-to-odd (Boldo and Melquiond), so a machine
// without FMA units computes the same bits, only slower. `make test` runs
// the arm64 build under qemu to hold its fused loop to those bits.
//
// Packing: A's strips and B's panels are copied k-major before the kernel
// reads them, unless the matrix is stored k-major with rows close enough
// to be read in place; a matrix stored the other way round is transposed
// 16 × 16 at a time in AVX-512 where the CPU has it. A B too large for
// the cache is packed as it is used: a panel at a time just before its
// tiles, or, stored k × n with a small C, a block of rows at a time. PackA
// and PackB pack an operand once for several products (a conv layer's
// weights, for every sample of a batch), and SgemmTSerial writes a
// product transposed, so that a C of few rows and many columns fills the
// kernel's tiles. Transpose is the 16 × 16 transpose for callers.
//
// Threads: a BLAS splits each large product over its thread budget
// (runtime.GOMAXPROCS when zero), by output tiles, never along k.
package gemm
