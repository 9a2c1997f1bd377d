package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/train"
)

// TestExportCommand: a checkpoint becomes an ONNX file; a corrupt one is an
// error naming it, and leaves no output; missing flags are usage errors.
func TestExportCommand(t *testing.T) {
	dir := t.TempDir()
	spec, err := train.BuiltinSpec("mlp", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	cfg := train.ModelConfig{Spec: spec, Batch: 1, Seed: 1}
	params, err := train.InitParams(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &train.Checkpoint{Model: cfg, Input: [3]int{1, 28, 28}, Classes: []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}}
	for _, p := range params {
		c.Params = append(c.Params, p.Data)
	}
	ckpt := filepath.Join(dir, "m.ckpt")
	if err := c.Save(ckpt); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "m.onnx")
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"export", "--checkpoint", ckpt, "--onnx", out}, &stdout, &stderr); err != nil {
		t.Fatalf("export: %v (%s)", err, stderr.String())
	}
	if st, err := os.Stat(out); err != nil || st.Size() < 4*200000 || !strings.Contains(stdout.String(), "opset 13") {
		t.Errorf("export wrote %v (%v), said %q", st, err, stdout.String())
	}

	b, _ := os.ReadFile(ckpt)
	b[len(b)/2] ^= 1
	bad := filepath.Join(dir, "bad.ckpt")
	os.WriteFile(bad, b, 0o644)
	badOut := filepath.Join(dir, "bad.onnx")
	err = run(context.Background(), []string{"export", "--checkpoint", bad, "--onnx", badOut}, &stdout, &stderr)
	if !errors.Is(err, train.ErrCheckpoint) || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("export of a corrupt checkpoint: %v; want ErrCheckpoint saying corrupt", err)
	}
	if _, err := os.Stat(badOut); !os.IsNotExist(err) {
		t.Errorf("export of a corrupt checkpoint left %s", badOut)
	}
	if err := run(context.Background(), []string{"export", "--checkpoint", ckpt}, &stdout, &stderr); !errors.Is(err, errUsage) {
		t.Errorf("export without --onnx: %v; want a usage error", err)
	}
}

// TestPredictRefusesAModelTooLargeForTheMachine: a checkpoint of a few
// hundred bytes whose model takes an input of 1×16384×16384 is refused
// before the model is built, saying how much memory it needs. Before, predict was killed
// at 24 GB.
func TestPredictRefusesAModelTooLargeForTheMachine(t *testing.T) {
	dir := t.TempDir()
	spec := train.Spec{Input: []int{1, 16384, 16384}, Layers: []train.Layer{
		{Type: train.LayerConv2D, Out: 1, Kernel: 3, Pad: 1}, {Type: train.LayerReLU},
		{Type: train.LayerMaxPool2D, Kernel: 16384}, {Type: train.LayerFlatten}, {Type: train.LayerLinear, Out: 2}}}
	cfg := train.ModelConfig{Spec: spec, Batch: 1, Seed: 1}
	sizes, err := spec.ParamSizes()
	if err != nil {
		t.Fatalf("the crafted spec: %v", err)
	}
	c := &train.Checkpoint{Model: cfg, Input: [3]int{1, 16384, 16384}, Classes: []string{"a", "b"}, Transforms: []data.TransformSpec{{Name: "ToTensor"}}}
	for _, n := range sizes {
		c.Params = append(c.Params, make([]float32, n))
	}
	ckpt := filepath.Join(dir, "huge.ckpt")
	if err := c.Save(ckpt); err != nil {
		t.Fatal(err)
	}
	img := "../../testdata/fashion-folder/test/Trouser/9965.png" // never read: the model is refused first
	var stdout, stderr bytes.Buffer
	err = run(context.Background(), []string{"predict", "--checkpoint", ckpt, "--image", img}, &stdout, &stderr)
	if !errors.Is(err, train.ErrSpec) || !strings.Contains(err.Error(), "memory") {
		t.Errorf("predict with a model of input 1×16384×16384: %v; want ErrSpec naming the memory it needs", err)
	}
}
