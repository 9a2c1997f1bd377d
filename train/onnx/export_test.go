package onnx

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	pb "github.com/ringtrain/ringtrain/train/onnx/onnxpb"
)

// The Fashion-MNIST subset in testdata/, once with the job's transforms
// (what ringtrain's model takes) and once with ToTensor alone (what the
// ONNX file takes: its Normalize is inside).
const (
	normConfig = `{"transforms": [{"name": "ToTensor", "args": []}, {"name": "Normalize", "args": [[0.5], [0.5]]}],
		"dataset_path": {"train": "fashion-mnist", "test": "fashion-mnist"}}`
	rawConfig = `{"transforms": [{"name": "ToTensor", "args": []}],
		"dataset_path": {"train": "fashion-mnist", "test": "fashion-mnist"}}`
)

func split(t *testing.T, config, which string) *data.Split {
	t.Helper()
	cfg, err := data.ParseConfig(strings.NewReader(config), "../../testdata")
	if err != nil {
		t.Fatal(err)
	}
	s, err := cfg.Load(which)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// firstBatch is the split's first n samples, in order.
func firstBatch(t *testing.T, s *data.Split, n int) *data.Batch {
	t.Helper()
	l := &data.Loader{Split: s, BatchSize: n, Seed: 1, Sampler: data.Sampler{N: s.Len(), World: 1, Seed: 1}}
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var b *data.Batch
	err = e.Each(func(x *data.Batch) error {
		if b == nil {
			b = &data.Batch{X: append([]float32(nil), x.X...), Y: append([]int(nil), x.Y...), N: x.N}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// trained trains model on testdata for a few steps and returns its
// checkpoint and the model, ready for a forward pass of batch samples.
func trained(t *testing.T, spec train.Spec, steps, batch int) (*train.Checkpoint, train.Model) {
	t.Helper()
	cfg := train.ModelConfig{Spec: spec, Batch: batch, Seed: 1}
	m, err := train.NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	one, err := ring.New(nil, ring.Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := train.NewReplica(m, train.NewAdam(0.003), one)
	s := split(t, normConfig, "train")
	l := &data.Loader{Split: s, BatchSize: batch, Seed: 1, Sampler: data.Sampler{N: s.Len(), World: 1, Seed: 1, Shuffle: true}}
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	n := 0
	errDone := errors.New("done")
	err = e.Each(func(b *data.Batch) error {
		if n++; n > steps {
			return errDone
		}
		_, err := r.Step(context.Background(), b.X, b.Y, b.N)
		return err
	})
	if err != nil && !errors.Is(err, errDone) {
		t.Fatal(err)
	}
	c := r.Snapshot(train.Checkpoint{Model: cfg, Classes: s.Classes, Transforms: transformsOf(t, normConfig), Input: [3]int{1, 28, 28}})
	return c, m
}

// runtime runs an ONNX file in onnxruntime (npm's onnxruntime-node, from
// RINGTRAIN_ONNXRUNTIME, the node_modules folder `make test-onnx` fills)
// on n samples and returns the logits.
func runtime(t *testing.T, model string, x []float32, shape []int64) []float32 {
	t.Helper()
	mods := os.Getenv("RINGTRAIN_ONNXRUNTIME")
	if mods == "" {
		t.Skip("SKIPPED: RINGTRAIN_ONNXRUNTIME is not set (make test-onnx installs onnxruntime-node and sets it)")
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "x.f32"), filepath.Join(dir, "y.f32")
	raw := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	if err := os.WriteFile(in, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	script := `
const ort = require('onnxruntime-node');
const fs = require('fs');
const [model, input, output, shape] = process.argv.slice(2);
(async () => {
  const s = await ort.InferenceSession.create(model);
  const b = fs.readFileSync(input);
  const x = new Float32Array(b.buffer, b.byteOffset, b.length / 4);
  const r = await s.run({input: new ort.Tensor('float32', x, JSON.parse(shape))});
  const y = r.logits.data;
  fs.writeFileSync(output, Buffer.from(y.buffer, y.byteOffset, y.byteLength));
})().catch(e => { console.error(e); process.exit(1); });
`
	js := filepath.Join(dir, "run.js")
	if err := os.WriteFile(js, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = strconv.FormatInt(d, 10)
	}
	cmd := exec.Command("node", js, model, in, out, "["+strings.Join(dims, ",")+"]")
	cmd.Env = append(os.Environ(), "NODE_PATH="+mods)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("onnxruntime: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	y := make([]float32, len(b)/4)
	for i := range y {
		y[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return y
}

// everyLayer is a spec with every layer kind a spec can hold: convs with
// padding, residual adds of conv and linear outputs, pooling, each
// activation, dropout.
var everyLayer = train.Spec{Input: []int{1, 28, 28}, Layers: []train.Layer{
	{Type: "conv2d", Out: 4, Kernel: 3, Pad: 1, Save: "a"}, {Type: "relu"},
	{Type: "conv2d", Out: 4, Kernel: 3, Pad: 1}, {Type: "add", From: "a"}, {Type: "tanh"},
	{Type: "maxpool2d", Kernel: 2}, {Type: "conv2d", Out: 3, Kernel: 5}, {Type: "flatten"}, {Type: "dropout", P: 0.3},
	{Type: "linear", Out: 16, Save: "b"}, {Type: "sigmoid"}, {Type: "linear", Out: 16}, {Type: "add", From: "b"},
	{Type: "relu"}, {Type: "linear", Out: 10},
}}

// TestRuntimeMatchesRingtrain: the cnn and the mlp, trained on testdata and
// exported, and a net of every layer kind give in onnxruntime the logits
// ringtrain's own forward pass gives on 64 test images (within 1e-4, the
// same class on every one), and the onnx package's checker accepts the
// files.
func TestRuntimeMatchesRingtrain(t *testing.T) {
	const n = 64
	mlp, _ := train.BuiltinSpec("mlp", 1, 28, 28, 10)
	cnn, _ := train.BuiltinSpec("cnn", 1, 28, 28, 10)
	for _, tc := range []struct {
		name  string
		spec  train.Spec
		steps int
		shape []int64
	}{
		{"mlp", mlp, 30, []int64{n, 784}},
		{"cnn", cnn, 3, []int64{n, 1, 28, 28}},
		{"every layer", everyLayer, 5, []int64{n, 1, 28, 28}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if os.Getenv("RINGTRAIN_ONNXRUNTIME") == "" {
				t.Skip("SKIPPED: RINGTRAIN_ONNXRUNTIME is not set (make test-onnx installs onnxruntime-node and sets it)")
			}
			c, m := trained(t, tc.spec, tc.steps, n)
			path := filepath.Join(t.TempDir(), "model.onnx")
			if err := Write(c, path); err != nil {
				t.Fatal(err)
			}
			check(t, path)
			norm := firstBatch(t, split(t, normConfig, "test"), n)
			raw := firstBatch(t, split(t, rawConfig, "test"), n)
			if _, err := m.Forward(norm.X, norm.Y, n); err != nil {
				t.Fatal(err)
			}
			want := m.Logits()[:n*10]
			got := runtime(t, path, raw.X, tc.shape)
			if len(got) != len(want) {
				t.Fatalf("onnxruntime gave %d logits; want %d", len(got), len(want))
			}
			worst := 0.0
			for i := range want {
				worst = max(worst, math.Abs(float64(got[i]-want[i])))
			}
			for s := range n {
				if a, b := argmax(got[10*s:10*s+10]), argmax(want[10*s:10*s+10]); a != b {
					t.Errorf("image %d: onnxruntime says class %d, ringtrain %d", s, a, b)
				}
			}
			if worst > 1e-4 {
				t.Errorf("logits differ by up to %.2e; want ≤ 1e-4", worst)
			}
			t.Logf("%s: max |onnxruntime − ringtrain| = %.2e over %d images", tc.name, worst, n)
		})
	}
}

// check runs the onnx package's checker (full_check: types and shapes
// inferred through the graph) on the file.
func check(t *testing.T, path string) {
	t.Helper()
	py := os.Getenv("RINGTRAIN_ONNX_PYTHON")
	if py == "" {
		t.Log("RINGTRAIN_ONNX_PYTHON not set: the onnx checker is not run")
		return
	}
	out, err := exec.Command(py, "-c", "import onnx, sys; onnx.checker.check_model(onnx.load(sys.argv[1]), full_check=True)", path).CombinedOutput()
	if err != nil {
		t.Fatalf("onnx checker refuses %s: %v\n%s", path, err, out)
	}
}

func argmax(v []float32) int {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return best
}

// TestExportGraph: the cnn's graph is the layers in order, Normalize
// first, and survives a protobuf round trip; the mlp takes a flat input.
func TestExportGraph(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ops   string
		input int
	}{
		{"cnn", "Sub Div Conv Relu MaxPool Conv Relu MaxPool Flatten Gemm Relu Gemm Identity", 4},
		{"mlp", "Sub Div Gemm Relu Gemm Relu Gemm Identity", 2},
	} {
		spec, _ := train.BuiltinSpec(tc.name, 1, 28, 28, 10)
		cfg := train.ModelConfig{Spec: spec, Batch: 1, Seed: 1}
		params, _ := train.InitParams(cfg)
		c := &train.Checkpoint{Model: cfg, Classes: []string{"a", "b"}, Transforms: transformsOf(t, normConfig)}
		for _, p := range params {
			c.Params = append(c.Params, p.Data)
		}
		m, err := Export(c)
		if err != nil {
			t.Fatal(err)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var back pb.ModelProto
		if err := proto.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		var ops []string
		for _, n := range back.GetGraph().GetNode() {
			ops = append(ops, n.GetOpType())
		}
		if got := strings.Join(ops, " "); got != tc.ops {
			t.Errorf("%s: nodes %s; want %s", tc.name, got, tc.ops)
		}
		if d := back.GetGraph().GetInput()[0].GetType().GetTensorType().GetShape().GetDim(); len(d) != tc.input || d[0].GetDimParam() != "batch" {
			t.Errorf("%s: input of %d dims (first %v); want %d with a free batch", tc.name, len(d), d[0], tc.input)
		}
		if back.GetOpsetImport()[0].GetVersion() != Opset || back.GetMetadataProps()[0].GetValue() != `["a","b"]` {
			t.Errorf("%s: opset %d, metadata %v", tc.name, back.GetOpsetImport()[0].GetVersion(), back.GetMetadataProps())
		}
	}
}

func transformsOf(t *testing.T, config string) []data.TransformSpec {
	t.Helper()
	cfg, err := data.ParseConfig(strings.NewReader(config), "")
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Transforms
}

// TestExportRefuses: checkpoints that do not describe an exportable model
// get ErrExport saying what is wrong, and Write leaves no file behind.
func TestExportRefuses(t *testing.T) {
	spec, _ := train.BuiltinSpec("mlp", 1, 28, 28, 10)
	good := func() *train.Checkpoint {
		cfg := train.ModelConfig{Spec: spec, Batch: 1, Seed: 1}
		params, _ := train.InitParams(cfg)
		c := &train.Checkpoint{Model: cfg, Transforms: transformsOf(t, normConfig)}
		for _, p := range params {
			c.Params = append(c.Params, p.Data)
		}
		return c
	}
	for _, tc := range []struct {
		name, want string
		edit       func(c *train.Checkpoint)
	}{
		{"a tensor missing", "parameter tensors", func(c *train.Checkpoint) { c.Params = c.Params[1:] }},
		{"a tensor cut short", "0.linear.weight has 3 values", func(c *train.Checkpoint) { c.Params[0] = c.Params[0][:3] }},
		{"an unknown layer", "checkpoint's model", func(c *train.Checkpoint) {
			c.Model.Spec.Layers = append(c.Model.Spec.Layers, train.Layer{Type: "softplus"})
		}},
		{"a broken transform", "transforms", func(c *train.Checkpoint) { c.Transforms = []data.TransformSpec{{Name: "Normalize"}} }},
	} {
		c := good()
		tc.edit(c)
		path := filepath.Join(t.TempDir(), "m.onnx")
		err := Write(c, path)
		if !errors.Is(err, ErrExport) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrExport mentioning %q", tc.name, err, tc.want)
		}
		if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 0 {
			t.Errorf("%s: Write left %d files behind", tc.name, len(entries))
		}
	}
	if _, err := exportWithin(good(), 1000); !errors.Is(err, ErrExport) || !strings.Contains(err.Error(), "at most 1000") {
		t.Errorf("a model over the size limit: %v; want ErrExport naming the limit", err)
	}
}

// A GPT exported runs in onnxruntime to ringtrain's logits, every
// position's, within 1e-4: the embedding, layernorms, causal attention
// and GELU as ringtrain computes them.
func TestRuntimeMatchesRingtrainGPT(t *testing.T) {
	if os.Getenv("RINGTRAIN_ONNXRUNTIME") == "" {
		t.Skip("SKIPPED: RINGTRAIN_ONNXRUNTIME is not set (make test-onnx installs onnxruntime-node and sets it)")
	}
	const n, T = 5, 12
	cfg := train.ModelConfig{Spec: train.GPTSpec(2, 16, 2, T), Batch: n, Seed: 4}
	cfg.Spec.Init = "" // He and Glorot's larger weights: attention that picks
	m, err := train.NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rng := rand.New(rand.NewPCG(3, 3))
	x, y := make([]float32, n*T), make([]int, n*T)
	for i := range x {
		x[i], y[i] = float32(rng.IntN(256)), rng.IntN(256)
	}
	opt := train.NewAdamW(1e-2, 0.1, train.DecayWeights(m.ParamNames()))
	for range 3 {
		if _, err := m.ForwardBackward(x, y, n); err != nil {
			t.Fatal(err)
		}
		opt.Step(m.Params(), m.Grads())
	}
	c := &train.Checkpoint{Model: cfg}
	for _, p := range m.Params() {
		c.Params = append(c.Params, slices.Clone(p))
	}
	path := filepath.Join(t.TempDir(), "gpt.onnx")
	if err := Write(c, path); err != nil {
		t.Fatal(err)
	}
	check(t, path)
	if _, err := m.Forward(x, y, n); err != nil {
		t.Fatal(err)
	}
	want := m.Logits()[:n*T*256]
	got := runtime(t, path, x, []int64{n, T})
	if len(got) != len(want) {
		t.Fatalf("onnxruntime gave %d logits; want %d", len(got), len(want))
	}
	worst := 0.0
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	if worst > 1e-4 {
		t.Errorf("logits differ by up to %.2e; want ≤ 1e-4", worst)
	}
	t.Logf("gpt: max |onnxruntime − ringtrain| = %.2e over %d positions", worst, n*T)
}
