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
