//go:build !amd64

package ring

// add sets dst[i] += src[i], unrolled by four since Go does not vectorise.
func add(dst, src []float32) {
	src = src[:len(dst)]
	i := 0
	for ; i+4 <= len(dst); i += 4 {
		d, s := dst[i:i+4:i+4], src[i:i+4:i+4]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// scale divides dst by n, giving exactly the bits of x/n; see add_amd64.go.
func scale(dst []float32, n int) {
	f := float32(n)
	if n&(n-1) == 0 {
		inv := 1 / f
		for i := range dst {
			dst[i] *= inv
		}
		return
	}
	for i := range dst {
		dst[i] /= f
	}
}
