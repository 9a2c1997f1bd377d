package train

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// attack is how a dishonest rank alters its own pseudo-gradient d before
// it is coded and sent, for the tests of robust aggregation and, in
// builds tagged ringtrain_attack, for an attacking peer; nothing in the
// default build calls it. The kinds:
//
//   - "scale": d × 100, a step far too long;
//   - "flip": −d, a step the wrong way;
//   - "noise": Gaussian noise ten times d's norm in place of d;
//   - "replay": the pseudo-gradient of the first round it sent, again.
func attack(kind string, seed uint64) (func(d []float32), error) {
	switch kind {
	case "scale":
		return func(d []float32) { scaleBy(d, 100) }, nil
	case "flip":
		return func(d []float32) { scaleBy(d, -1) }, nil
	case "noise":
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		return func(d []float32) {
			var nn float64
			for _, v := range d {
				nn += float64(v) * float64(v)
			}
			sd := 10 * math.Sqrt(nn/float64(max(len(d), 1)))
			for i := range d {
				d[i] = float32(rng.NormFloat64() * sd)
			}
		}, nil
	case "replay":
		var first []float32
		return func(d []float32) {
			if first == nil {
				first = append([]float32(nil), d...)
				return
			}
			copy(d, first)
		}, nil
	}
	return nil, fmt.Errorf("train: attack %q; want scale, flip, noise or replay", kind)
}

func scaleBy(x []float32, f float32) {
	for j := range x {
		x[j] *= f
	}
}
