package train

import (
	"math"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestLogSoftMaxFarRows: rows whose values are far from the first row's
// first element, and a row whose largest value is its first, give the
// log softmax of each row and its gradient, all finite — where gorgonia's
// LogSoftMax gives ±Inf, and the loss NaN.
func TestLogSoftMaxFarRows(t *testing.T) {
	h := []float32{
		-200, 0, 0,
		300, -100, 300,
		500, 0, -90,
		1, 2, 3,
	}
	g := G.NewGraph()
	x := G.NewMatrix(g, G.Float32, G.WithShape(4, 3), G.WithValue(tensor.New(tensor.WithShape(4, 3), tensor.WithBacking(h))), G.WithName("h"))
	logp := G.Must(logSoftMax(x))
	cost := G.Must(G.Sum(logp))
	if _, err := G.Grad(cost, x); err != nil {
		t.Fatal(err)
	}
	vm := G.NewTapeMachine(g)
	defer vm.Close()
	if err := vm.RunAll(); err != nil {
		t.Fatal(err)
	}
	got := logp.Value().Data().([]float32)
	dv, err := x.Grad()
	if err != nil {
		t.Fatal(err)
	}
	grad := dv.Data().([]float32)
	for r := range 4 {
		row := h[3*r : 3*r+3]
		top := math.Inf(-1)
		for _, v := range row {
			top = math.Max(top, float64(v))
		}
		sum := 0.0
		for _, v := range row {
			sum += math.Exp(float64(v) - top)
		}
		for k, v := range row {
			want := float64(v) - top - math.Log(sum)
			if math.Abs(float64(got[3*r+k])-want) > 1e-4 {
				t.Errorf("row %d: log softmax %v; want %v at %d", r, got[3*r:3*r+3], want, k)
			}
			// d/dh of Σ_k logp_k is 1 − 3·softmax.
			wantGrad := 1 - 3*math.Exp(want)
			if math.Abs(float64(grad[3*r+k])-wantGrad) > 1e-4 {
				t.Errorf("row %d: gradient %v; want %v at %d", r, grad[3*r:3*r+3], wantGrad, k)
			}
		}
	}
}
