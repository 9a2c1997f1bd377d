package ringbench

import (
	"context"
	"testing"
)

// BenchmarkAllreduceTCP is the go test -bench face of Run: 4 ranks, 16 MiB, over loopback TCP.
func BenchmarkAllreduceTCP(b *testing.B) {
	for b.Loop() {
		err := Run(context.Background(), Builtin(), Config{Transport: "tcp", Peers: 4, Sizes: []int{16 << 20}, Iters: 5}, func(r Result) {
			b.ReportMetric(r.Busbw, "busbw_GB/s")
			b.ReportMetric(r.CeilingBusbw, "ceiling_GB/s")
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
