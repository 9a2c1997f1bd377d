package ring

// addBlocks adds src into dst for the first len(dst)&^15 elements;
// len(src) must be at least len(dst).
//
//go:noescape
func addBlocks(dst, src []float32)

// add sets dst[i] += src[i]. On every byte a reduce-scatter receives, so it
// is SSE assembly; float addition is commutative, so the bits are those of
// the plain loop.
func add(dst, src []float32) {
	src = src[:len(dst)]
	addBlocks(dst, src)
	for i := len(dst) &^ 15; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// mulBlocks and divBlocks multiply and divide the first len(dst)&^15
// elements of dst by f, with SSE.
//
//go:noescape
func mulBlocks(dst []float32, f float32)

//go:noescape
func divBlocks(dst []float32, f float32)

// scale divides dst by n, giving exactly the bits of x/n: with a multiply by
// 1/n where n is a power of two (1/n is then exact, so the product rounds as
// the quotient), which costs a fraction of a divide, and with SSE divides
// otherwise. Division rather than a multiply by an inexact 1/n keeps the
// mean as close as float32 allows to the true one.
func scale(dst []float32, n int) {
	f := float32(n)
	if n&(n-1) == 0 {
		inv := 1 / f
		mulBlocks(dst, inv)
		for i := len(dst) &^ 15; i < len(dst); i++ {
			dst[i] *= inv
		}
		return
	}
	divBlocks(dst, f)
	for i := len(dst) &^ 15; i < len(dst); i++ {
		dst[i] /= f
	}
}
