package vec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// rowOpInputs are rows of every length up to 70 and a few longer, of
// normal values with the awkward ones mixed in: ±0, ±Inf, subnormals.
func rowOpInputs(withNaN bool) [][]float32 {
	rng := rand.New(rand.NewPCG(4, 4))
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-41, -1e-41, 3e38}
	if withNaN {
		special = append(special, float32(math.NaN()))
	}
	var rows [][]float32
	for _, n := range append([]int{1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 70, 128, 129, 256}, rng.IntN(300)+1) {
		row := make([]float32, n)
		for i := range row {
			row[i] = float32(rng.NormFloat64() * 10)
			if rng.IntN(8) == 0 {
				row[i] = special[rng.IntN(len(special))]
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// TestRowOps: the vector row operations give the scalar loops' bits —
// AddScalar, Scale and MulSub element by element, Max the same value (a
// zero's sign aside, which no softmax sees).
func TestRowOps(t *testing.T) {
	for _, row := range rowOpInputs(false) {
		want := row[0]
		for _, v := range row {
			if v > want {
				want = v
			}
		}
		if got := Max(row); got != want {
			t.Errorf("Max of %d values = %v; want %v", len(row), got, want)
		}
	}
	for _, row := range rowOpInputs(true) {
		for _, c := range []float32{1.5, -3.25, 0, float32(math.Copysign(0, -1)), 1e-41} {
			add, scale, ms := append([]float32(nil), row...), append([]float32(nil), row...), append([]float32(nil), row...)
			AddScalar(add, add, c)
			Scale(scale, scale, c)
			into := make([]float32, len(row))
			AddScalar(into, row, c)
			p := make([]float32, len(row)+3)
			for i := range p {
				p[i] = float32(i%7) - 2.5
			}
			MulSub(ms, p, c)
			for i, v := range row {
				same := func(what string, got, want float32) {
					if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
						t.Errorf("%s, %d values, c %v: [%d] = %v; want %v", what, len(row), c, i, got, want)
					}
				}
				same("AddScalar", add[i], v+c)
				same("AddScalar into another slice", into[i], v+c)
				same("Scale", scale[i], v*c)
				same("MulSub", ms[i], p[i]*float32(v-c))
			}
		}
	}
}

// TestMaxWithNaN: a NaN in a row leaves Max a number or a NaN, never a
// value that is not in the row.
func TestMaxWithNaN(t *testing.T) {
	for _, row := range rowOpInputs(true) {
		got := Max(row)
		found := got != got
		for _, v := range row {
			found = found || v == got
		}
		if !found {
			t.Errorf("Max of %d values = %v, which is not among them", len(row), got)
		}
	}
}
