package ringbench

import (
	"context"
	"math"
	"strings"
	"testing"
)

func TestRunEmitsARowPerSize(t *testing.T) {
	for _, tr := range []string{"mem", "tcp"} {
		var rows []Result
		err := Run(context.Background(), Builtin(), Config{Transport: tr, Peers: 3, Sizes: []int{4096, 1 << 16}, Iters: 1},
			func(r Result) { rows = append(rows, r) })
		if err != nil {
			t.Fatalf("Run(%s): %v", tr, err)
		}
		if len(rows) != 2 {
			t.Fatalf("Run(%s) gave %d rows; want 2", tr, len(rows))
		}
		for _, r := range rows {
			if r.Seconds <= 0 || r.Busbw <= 0 || r.CeilingBusbw <= 0 || math.Abs(r.Busbw-r.Algbw*4/3) > 1e-9*r.Busbw {
				t.Errorf("Run(%s) row %+v: want positive figures and busbw = algbw·2(n−1)/n", tr, r)
			}
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string
	}{
		{Config{Transport: "carrier-pigeon", Peers: 2, Sizes: []int{4}}, "unknown transport"},
		{Config{Transport: "mem", Peers: 1, Sizes: []int{4}}, "at least 2"},
		{Config{Transport: "mem", Peers: 2, Sizes: []int{6}}, "multiple of 4"},
	}
	for _, tt := range tests {
		err := Run(context.Background(), Builtin(), tt.cfg, func(Result) {})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Run(%+v) = %v; want an error saying %q", tt.cfg, err, tt.want)
		}
	}
}
