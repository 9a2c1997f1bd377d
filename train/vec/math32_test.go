package vec

import (
	"math"
	"testing"
)

// Erf32 and Exp32 against float64's, over their ranges, finely.
func TestMath32(t *testing.T) {
	var worstErf, worstExp float64
	for i := -120000; i <= 120000; i++ {
		x := float32(i) / 10000 // −12 … 12
		if e := math.Abs(float64(Erf32(x)) - math.Erf(float64(x))); e > worstErf {
			worstErf = e
		}
	}
	for i := -870000; i <= 880000; i++ {
		x := float32(i) / 10000
		want := math.Exp(float64(x))
		if e := math.Abs(float64(Exp32(x))-want) / want; e > worstExp && want > 1e-37 {
			worstExp = e
		}
	}
	if worstErf > 5e-7 || worstExp > 2e-7 {
		t.Errorf("worst errors: erf %.3g absolute, exp %.3g relative; want within 5e-7 and 2e-7", worstErf, worstExp)
	}
	if Exp32(-100) != 0 || !math.IsInf(float64(Exp32(100)), 1) || Exp32(0) != 1 || Erf32(0) != 0 || Erf32(9) != 1 || Erf32(-9) != -1 {
		t.Errorf("edges: exp(−100) %v, exp(100) %v, exp(0) %v, erf(0) %v, erf(±9) %v %v", Exp32(-100), Exp32(100), Exp32(0), Erf32(0), Erf32(9), Erf32(-9))
	}
	if v := Exp32(float32(math.NaN())); v == v {
		t.Errorf("exp(NaN) = %v; want NaN", v)
	}
}
