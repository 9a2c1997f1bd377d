package train

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train/sparse"
)

// tinyGPT is a GPT small enough to check by finite differences.
func tinyGPT(t *testing.T, batch int) ModelConfig {
	t.Helper()
	return ModelConfig{Spec: GPTSpec(2, 8, 2, 6), Batch: batch, Seed: 3}
}

// textBatch is n windows of the corpus at random offsets, as the loader
// makes them: T input bytes and the T bytes after each.
func textBatch(rng *rand.Rand, corpus string, n, T int) ([]float32, []int) {
	x, y := make([]float32, n*T), make([]int, n*T)
	for k := range n {
		o := rng.IntN(len(corpus) - T)
		for i := range T {
			x[k*T+i], y[k*T+i] = float32(corpus[o+i]), int(corpus[o+i+1])
		}
	}
	return x, y
}

// The GPT's gradients are those of its loss: for every parameter
// tensor, the loss's slope along the gradient and along a random
// direction (central differences of a small step) is the gradient's
// projection on that direction.
// Both with GPT's small initialisation and with He and Glorot's, whose
// larger weights make attention pick among positions (with GPT's, every
// position attends to the ones before it nearly alike, and attention's
// gradients are small).
func TestGPTGradients(t *testing.T) {
	for _, init := range []string{"gpt", ""} {
		t.Run("init "+init, func(t *testing.T) {
			cfg := tinyGPT(t, 3)
			cfg.Spec.Init = init
			checkLMGradients(t, cfg)
		})
	}
}

func checkLMGradients(t *testing.T, cfg ModelConfig) {
	m, err := NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	x, y := textBatch(rng, strings.Repeat("the quick brown fox jumps over the lazy dog. ", 4), 3, 6)
	if _, err := m.ForwardBackward(x, y, 3); err != nil {
		t.Fatal(err)
	}
	grads := make([][]float32, len(m.Grads()))
	for i, g := range m.Grads() {
		grads[i] = slices.Clone(g)
	}
	// The loss from the logits in float64: the model's own float32 mean
	// cannot tell a small step's change from its rounding.
	loss := func() float64 {
		if _, err := m.Forward(x, y, 3); err != nil {
			t.Fatal(err)
		}
		logits := m.Logits()
		var sum float64
		for r, label := range y {
			row := logits[r*256 : (r+1)*256]
			top := float64(slices.Max(row))
			var z float64
			for _, v := range row {
				z += math.Exp(float64(v) - top)
			}
			sum += top + math.Log(z) - float64(row[label])
		}
		return sum / float64(len(y))
	}
	for i, p := range m.Params() {
		name := m.ParamNames()[i]
		random := make([]float64, len(p))
		for j := range random {
			random[j] = rng.NormFloat64()
		}
		along := make([]float64, len(p))
		for j, g := range grads[i] {
			along[j] = float64(g)
		}
		for dir, u := range map[string][]float64{"the gradient": along, "a random direction": random} {
			var n float64
			for _, v := range u {
				n += v * v
			}
			n = math.Sqrt(n)
			if n == 0 {
				t.Errorf("%s: a zero gradient", name)
				continue
			}
			// A step of norm 0.001, less for a small tensor, whose values
			// each move further (a bias of the residual stream, which a
			// layernorm scales up: the loss bends sharply there).
			h := 1e-3 * min(1, math.Sqrt(float64(len(p))/256))
			orig := slices.Clone(p)
			move := func(s float64) float64 {
				for j := range p {
					p[j] = orig[j] + float32(s*h*u[j]/n)
				}
				return loss()
			}
			slope := (move(1) - move(-1)) / (2 * h)
			copy(p, orig)
			var want float64 // the gradient's projection on u
			for j, g := range grads[i] {
				want += float64(g) * u[j] / n
			}
			if math.Abs(slope-want) > 0.02*math.Abs(want)+2e-5 {
				t.Errorf("%s along %s: the loss's slope %.6g; the gradient says %.6g", name, dir, slope, want)
			}
		}
	}
	if len(m.Params()) != 2+12*2+2+2 {
		t.Errorf("%d parameter tensors; want the embedding's 2, 12 per block, the last layernorm's and the output layer's", len(m.Params()))
	}
}

// A GPT learns a text it sees again and again, and its logits give every
// position its next byte; a model of one thread and one of four hold the
// same bits after the same steps.
func TestGPTLearnsAndKeepsItsBits(t *testing.T) {
	corpus := strings.Repeat("abcdefgh", 40)
	run := func(threads int) ([]float32, float32, float32) {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
		cfg := ModelConfig{Spec: GPTSpec(1, 16, 2, 8), Batch: 8, Seed: 1}
		m, err := NewModel(cfg)
		if err != nil {
			t.Fatal(err)
		}
		opt := NewAdamW(3e-3, 0.1, DecayWeights(m.ParamNames()))
		rng := rand.New(rand.NewPCG(4, 4))
		var first, last float32
		for s := range 150 {
			x, y := textBatch(rng, corpus, 8, 8)
			l, err := m.ForwardBackward(x, y, 8)
			if err != nil {
				t.Fatal(err)
			}
			if s == 0 {
				first = l
			}
			last = l
			opt.Step(m.Params(), m.Grads())
		}
		return slices.Concat(m.Params()...), first, last
	}
	p1, first, last := run(1)
	if !(first > 4 && last < 0.5) {
		t.Errorf("loss %v at the first step, %v after 150; want about ln 256 = 5.5, then under 0.5", first, last)
	}
	if p4, _, _ := run(4); !slices.Equal(p1, p4) {
		t.Error("the GPT's parameters differ between 1 and 4 threads")
	}
}

func TestGPTSpecRefuses(t *testing.T) {
	for name, s := range map[string]Spec{
		"heads that do not divide the width": {Input: []int{8}, Layers: []Layer{{Type: LayerEmbedding, Out: 10}, {Type: LayerLinear, Out: 30}, {Type: LayerAttention, Heads: 4}, {Type: LayerLinear, Out: 256}}},
		"an embedding after the first layer": {Input: []int{8}, Layers: []Layer{{Type: LayerLinear, Out: 8}, {Type: LayerEmbedding, Out: 4}, {Type: LayerLinear, Out: 256}}},
		"attention of flat features":         {Input: []int{12}, Layers: []Layer{{Type: LayerAttention, Heads: 1}, {Type: LayerLinear, Out: 2}}},
		"an unknown init":                    {Input: []int{8}, Init: "xavier", Layers: []Layer{{Type: LayerEmbedding, Out: 4}, {Type: LayerLinear, Out: 256}}},
		"a table over the bound":             {Input: []int{8}, Layers: []Layer{{Type: LayerEmbedding, Out: 1 << 20, Vocab: 1 << 20}, {Type: LayerLinear, Out: 256}}},
	} {
		if _, err := s.Shapes(); err == nil {
			t.Errorf("%s: taken", name)
		}
	}
	if _, err := GPTSpec(4, 128, 4, 128).Shapes(); err != nil {
		t.Errorf("the reference GPT: %v", err)
	}
}

// textLoader is a loader over a text corpus: windows of T+1 bytes.
func textLoader(t *testing.T, corpus string, T, batch int, shuffle bool) *data.Loader {
	t.Helper()
	s := &data.Split{Dataset: &data.Dataset{Source: "test corpus"}, Pipeline: &data.Pipeline{}, C: 1, H: 1, Text: &data.Text{Source: "test corpus", Bytes: []byte(corpus)}}
	if err := s.SetContext(T); err != nil {
		t.Fatal(err)
	}
	return &data.Loader{Split: s, BatchSize: batch, Seed: 1, Sampler: data.Sampler{N: s.Len(), World: 1, Seed: 1, Shuffle: shuffle, Exact: !shuffle}}
}

// A GPT job's features are a model's: three ranks train it in each DiLoCo
// mode — sparse rounds, the outer sync streamed in fragments beside inner
// steps, rounds closed by a deadline — with AdamW and clipping (the
// epoch's uneven end included) to one hash, validate on the held-out
// windows, and a checkpoint restores its bits.
func TestGPTInTheRing(t *testing.T) {
	const n, T, batch = 3, 8, 4
	corpus := strings.Repeat("to be or not to be, that is the question. ", 30)
	train, val := corpus[:len(corpus)*9/10], corpus[len(corpus)*9/10:]
	for _, tc := range []struct {
		name string
		sync LocalSGD
	}{
		{"sparse rounds", LocalSGD{Every: 3, LR: 0.7, Momentum: 0.9, Nesterov: true, Sparse: &sparse.Config{Fraction: 0.25, Bits: 4}}},
		{"streamed", LocalSGD{Every: 4, LR: 0.7, Momentum: 0.9, Nesterov: true, Fragments: 2, Overlap: 1}},
		{"deadline rounds", LocalSGD{Every: 3, LR: 1, Deadline: time.Minute, Quorum: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := memRings(t, n)
			hashes := make([][32]byte, n)
			sums := make([]Summary, n)
			reps := make([]*Replica, n)
			err := onAll(n, func(i int) error {
				m, err := NewModel(ModelConfig{Spec: GPTSpec(1, 16, 2, T), Batch: batch, Seed: 2})
				if err != nil {
					return err
				}
				o := tc.sync
				o.Inner = NewAdamW(3e-3, 0.1, DecayWeights(m.ParamNames()))
				reps[i] = NewLocalReplica(m, &o, rings[i])
				reps[i].ClipNorm = 1
				sums[i], err = Run(context.Background(), RunConfig{Replica: reps[i], Train: textLoader(t, train, T, batch, true),
					Test: textLoader(t, val, T, batch, false), Epochs: 2, Classes: 256})
				hashes[i] = reps[i].ParamHash()
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				if hashes[i] != hashes[0] || sums[i].TestLoss != sums[0].TestLoss {
					t.Errorf("rank %d: hash %x, validation loss %v; rank 0 %x, %v", i, hashes[i][:4], sums[i].TestLoss, hashes[0][:4], sums[0].TestLoss)
				}
			}
			if !(sums[0].TestLoss < 4.5) || sums[0].TestSamples != (len(val)-T)/(T+1)*T {
				t.Errorf("validation loss %v over %d positions; want under 4.5 (ln 256 is 5.5), over every position of the validation windows", sums[0].TestLoss, sums[0].TestSamples)
			}
			c := reps[0].Snapshot(Checkpoint{Model: ModelConfig{Spec: GPTSpec(1, 16, 2, T), Batch: batch, Seed: 2}})
			m, err := NewModel(c.Model)
			if err != nil {
				t.Fatal(err)
			}
			restored := NewReplica(m, NewAdamW(3e-3, 0.1, DecayWeights(m.ParamNames())), nil)
			if err := c.LoadInto(m); err != nil || restored.ParamHash() != hashes[0] {
				t.Errorf("restored from the checkpoint: %v, hash %x; want %x", err, restored.ParamHash(), hashes[0])
			}
		})
	}
}

// EvalEvery scores at its multiples where every step syncs, and at the
// end of the round a multiple falls in where LocalSGD rounds run (a
// multiple inside a round used to pass unscored).
func TestEvalEvery(t *testing.T) {
	const T, batch = 8, 4
	corpus := strings.Repeat("to be or not to be, that is the question. ", 20)
	// The corpus gives 23 steps of 4 windows: a round of 3 closes at
	// steps 3, 6, …, 21 and at the epoch's end, 23, which the epoch's own
	// scoring covers.
	for _, tc := range []struct {
		name  string
		every int // LocalSGD's round, 0 for a sync every step
		eval  int
		want  []int
	}{
		{"every step", 0, 5, []int{5, 10, 15, 20}},
		{"rounds of 3", 3, 2, []int{3, 6, 9, 12, 15, 18, 21}},
		{"rounds of 3, eval 7", 3, 7, []int{9, 15, 21}},
		{"rounds of 3, eval 19", 3, 19, []int{21}},
		{"rounds of 3, eval 22: the epoch's end", 3, 22, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewModel(ModelConfig{Spec: GPTSpec(1, 16, 2, T), Batch: batch, Seed: 2})
			if err != nil {
				t.Fatal(err)
			}
			one, err := ring.New(nil, ring.Config{Size: 1})
			if err != nil {
				t.Fatal(err)
			}
			rep := NewReplica(m, NewAdamW(3e-3, 0.1, nil), one)
			if tc.every > 0 {
				rep = NewLocalReplica(m, &LocalSGD{Inner: NewAdamW(3e-3, 0.1, nil), Every: tc.every, LR: 1}, one)
			}
			var at []int
			rc := RunConfig{Replica: rep, Train: textLoader(t, corpus, T, batch, true),
				Test: textLoader(t, corpus[:200], T, batch, false), Epochs: 1, Classes: 256, EvalEvery: tc.eval,
				Progress: func(p Progress) {
					if p.Validation {
						if !(p.TestLoss > 0) {
							t.Errorf("a validation at step %d without a loss", p.Step)
						}
						at = append(at, p.Step)
					}
				}}
			steps := rc.Train.Batches()
			if _, err := Run(context.Background(), rc); err != nil {
				t.Fatal(err)
			}
			if steps != 23 || !slices.Equal(at, tc.want) {
				t.Errorf("validations at steps %v of %d; want %v of 23", at, steps, tc.want)
			}
		})
	}
}

// With rows enough to split every layer over threads (layernorm's, GELU's,
// attention's tasks, the loss's rows), a GPT of one thread and one of four
// hold the same bits after the same steps. -short (make test's arm64 run,
// where qemu makes a step of the full shape half a minute) takes one step
// of a narrower model over more rows, which splits every layer still.
func TestGPTSameBitsWhateverTheThreads(t *testing.T) {
	const T = 64
	dim, batch, steps := 128, 32, 2
	if testing.Short() {
		dim, batch, steps = 32, 128, 1
	}
	corpus := strings.Repeat("It was the best of times, it was the worst of times; ", 40)
	run := func(threads int) []float32 {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(threads))
		m, err := NewModel(ModelConfig{Spec: GPTSpec(1, dim, 4, T), Batch: batch, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		opt := NewAdamW(1e-3, 0.1, DecayWeights(m.ParamNames()))
		rng := rand.New(rand.NewPCG(6, 6))
		for range steps {
			x, y := textBatch(rng, corpus, batch, T)
			if _, err := m.ForwardBackward(x, y, batch); err != nil {
				t.Fatal(err)
			}
			opt.Step(m.Params(), m.Grads())
		}
		return slices.Concat(m.Params()...)
	}
	if !slices.Equal(run(1), run(4)) {
		t.Error("the GPT's parameters differ between 1 and 4 threads")
	}
}
