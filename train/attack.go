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
//
// The function is called on the whole update, or piece by piece (a
// bucket of gradients at a time), with the piece's first coordinate off.
func attack(kind string, seed uint64) (func(d []float32, off int), error) {
	switch kind {
	case "scale":
		return func(d []float32, _ int) { scaleBy(d, 100) }, nil
	case "flip":
		return func(d []float32, _ int) { scaleBy(d, -1) }, nil
	case "noise":
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		return func(d []float32, _ int) {
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
		first := map[int][]float32{} // each piece's first, by where it starts
		return func(d []float32, off int) {
			if f, ok := first[off]; ok && len(f) == len(d) {
				copy(d, f)
				return
			}
			first[off] = append([]float32(nil), d...)
		}, nil
	}
	return nil, fmt.Errorf("train: attack %q; want scale, flip, noise or replay", kind)
}

func scaleBy(x []float32, f float32) {
	for j := range x {
		x[j] *= f
	}
}
