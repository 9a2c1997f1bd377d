package pipeline

import (
	"errors"
	"fmt"
	"testing"
)

func TestSchedule(t *testing.T) {
	tests := []struct {
		kind         Kind
		stages, s, m int
		want         string
		inFlight     int
	}{
		{GPipe, 2, 0, 3, "[F0 F1 F2 B0 B1 B2]", 3},
		{GPipe, 4, 3, 2, "[F0 B0 F1 B1]", 1}, // the last stage: each as it comes
		{GPipe, 1, 0, 2, "[F0 F1 B0 B1]", 2},
		{OneFOneB, 1, 0, 3, "[F0 B0 F1 B1 F2 B2]", 1},
		{OneFOneB, 2, 0, 4, "[F0 F1 B0 F2 B1 F3 B2 B3]", 2},
		{OneFOneB, 2, 1, 4, "[F0 B0 F1 B1 F2 B2 F3 B3]", 1},
		{OneFOneB, 4, 0, 8, "[F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7]", 4},
		{OneFOneB, 4, 1, 8, "[F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7]", 3},
		{OneFOneB, 4, 0, 2, "[F0 F1 B0 B1]", 2}, // fewer micro-batches than stages
	}
	for _, tt := range tests {
		ops, err := Schedule(tt.kind, tt.stages, tt.s, tt.m)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(ops); got != tt.want {
			t.Errorf("%s stage %d of %d, %d: %s; want %s", tt.kind, tt.s, tt.stages, tt.m, got, tt.want)
		}
		if got := InFlight(ops); got != tt.inFlight {
			t.Errorf("%s stage %d of %d, %d: %d in flight; want %d", tt.kind, tt.s, tt.stages, tt.m, got, tt.inFlight)
		}
	}
}

// Every 1F1B stage holds at most S−s micro-batches, and every schedule
// runs each micro-batch once each way, in order.
func TestScheduleBounds(t *testing.T) {
	for _, kind := range []Kind{GPipe, OneFOneB} {
		for stages := 1; stages <= 6; stages++ {
			for m := 1; m <= 9; m++ {
				for s := range stages {
					ops, err := Schedule(kind, stages, s, m)
					if err != nil {
						t.Fatal(err)
					}
					f, b := 0, 0
					for _, o := range ops {
						if o.Backward {
							if o.MB != b || b >= f {
								t.Fatalf("%s %d/%d m=%d: %v runs backward out of order", kind, s, stages, m, ops)
							}
							b++
						} else {
							if o.MB != f {
								t.Fatalf("%s %d/%d m=%d: %v runs forward out of order", kind, s, stages, m, ops)
							}
							f++
						}
					}
					if f != m || b != m {
						t.Fatalf("%s %d/%d m=%d: %v", kind, s, stages, m, ops)
					}
					if kind == OneFOneB && InFlight(ops) > stages-s {
						t.Errorf("1f1b stage %d of %d, m=%d: %d in flight", s, stages, m, InFlight(ops))
					}
				}
			}
		}
	}
}

func TestScheduleRefuses(t *testing.T) {
	for _, tt := range []struct {
		kind         Kind
		stages, s, m int
	}{{"zigzag", 2, 0, 2}, {GPipe, 0, 0, 1}, {GPipe, 2, 2, 1}, {OneFOneB, 2, -1, 1}, {OneFOneB, 2, 0, 0}} {
		if _, err := Schedule(tt.kind, tt.stages, tt.s, tt.m); !errors.Is(err, ErrConfig) {
			t.Errorf("Schedule(%q, %d, %d, %d): %v; want ErrConfig", tt.kind, tt.stages, tt.s, tt.m, err)
		}
	}
}
