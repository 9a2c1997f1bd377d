package vec

import "math"

// sqrt32 is the correctly rounded float32 square root: the float64 root
// rounded to float32 is (53 ≥ 2·24+2), as VSQRTPS's is.
func sqrt32(x float32) float32 { return float32(math.Sqrt(float64(x))) }
