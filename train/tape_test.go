package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// TestTapeMatchesTapeMachine: the tape computes what gorgonia's
// TapeMachine computes from the same graph — the loss and every
// gradient, bit for bit — on the mlp, the cnn and a net with a residual
// connection, dropout and tanh (gorgonia's own ops among ours).
func TestTapeMatchesTapeMachine(t *testing.T) {
	mlp, _ := BuiltinSpec("mlp", 1, 28, 28, 10)
	cnn, _ := BuiltinSpec("cnn", 1, 28, 28, 10)
	res := Spec{Input: []int{784}, Layers: []Layer{
		{Type: LayerLinear, Out: 32}, {Type: LayerReLU, Save: "a"}, {Type: LayerLinear, Out: 32},
		{Type: LayerAdd, From: "a"}, {Type: LayerDropout, P: 0.3}, {Type: LayerTanh}, {Type: LayerLinear, Out: 10}}}
	for name, spec := range map[string]Spec{"mlp": mlp, "cnn": cnn, "residual": res} {
		t.Run(name, func(t *testing.T) {
			const batch = 4
			mod, err := NewModel(ModelConfig{Spec: spec, Batch: batch, Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			m := mod.(*graphModel)
			m.SeedMasks(9)
			rng := rand.New(rand.NewPCG(6, 6))
			x, y := randomBatch(rng, batch, 784, 10)
			loss, err := m.ForwardBackward(x, y, batch)
			if err != nil {
				t.Fatal(err)
			}
			var grads [][]float32
			for _, g := range m.Grads() {
				grads = append(grads, slices.Clone(g))
			}
			// The same inputs and masks, through gorgonia's machine.
			vm := G.NewTapeMachine(m.g)
			defer vm.Close()
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			if got := m.cost.Value().Data().(float32); math.Float32bits(got) != math.Float32bits(loss) {
				t.Fatalf("loss %v on the tape, %v on the TapeMachine", loss, got)
			}
			for i, n := range m.gradNodes {
				want := n.Value().Data().([]float32)
				for j, v := range grads[i] {
					if math.Float32bits(v) != math.Float32bits(want[j]) {
						t.Fatalf("%s gradient [%d] = %v on the tape, %v on the TapeMachine", m.names[i], j, v, want[j])
					}
				}
			}
		})
	}
}

// The tape adds tensors of one shape into memory it keeps from run to
// run — the sum gorgonia's Add gives, without its clone each run — and
// leaves an add of another kind (a scalar's) to gorgonia.
func TestTapeKeepsItsSums(t *testing.T) {
	g := G.NewGraph()
	av := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6}))
	bv := tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float32{0.5, 0.25, -3, 1e-8, 5, -6}))
	a := G.NewMatrix(g, G.Float32, G.WithShape(2, 3), G.WithName("a"), G.WithValue(av))
	b := G.NewMatrix(g, G.Float32, G.WithShape(2, 3), G.WithName("b"), G.WithValue(bv))
	s := G.NewScalar(g, G.Float32, G.WithName("s"), G.WithValue(float32(2)))
	c := G.Must(G.Add(a, b))
	d := G.Must(G.Add(s, s))
	tp := newTape(c, d)
	var first []float32
	for run := range 2 {
		if err := tp.run(); err != nil {
			t.Fatal(err)
		}
		got := tp.value(c).Data().([]float32)
		for i, x := range av.Data().([]float32) {
			if want := x + bv.Data().([]float32)[i]; got[i] != want {
				t.Fatalf("run %d: sum[%d] = %v; want %v", run, i, got[i], want)
			}
		}
		if run == 0 {
			first = got
		} else if &got[0] != &first[0] {
			t.Error("the sum moved to new memory on the second run; want the memory kept")
		}
		if v := tp.value(d).Data().(float32); v != 4 {
			t.Fatalf("the scalar sum is %v; want 4", v)
		}
	}
}
