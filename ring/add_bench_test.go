package ring

import "testing"

func BenchmarkAddCold(b *testing.B) {
	dst := make([]float32, 16<<20)
	src := make([]float32, 256<<10)
	b.SetBytes(4 << 18)
	off := 0
	for b.Loop() {
		add(dst[off:off+len(src)], src)
		off = (off + len(src)) % len(dst)
	}
}
