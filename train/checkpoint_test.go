package train

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
)

func solo(t *testing.T) *ring.Ring {
	t.Helper()
	r, err := ring.New(nil, ring.Config{Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestResumeEqualsUninterrupted: two epochs straight, against one epoch, a
// checkpoint, a fresh process's worth of objects loading it, and the second
// epoch — the same parameters, bit for bit, for SGD with momentum and Adam,
// and with dropout, whose masks must come out as they would have.
func TestResumeEqualsUninterrupted(t *testing.T) {
	const batch = 32
	for _, optName := range []string{"sgd", "adam", "adam+dropout"} {
		t.Run(optName, func(t *testing.T) {
			cfg := mlpCfg(784, []int{32}, 10, batch, 4)
			if optName == "adam+dropout" {
				cfg.Spec.Layers = slices.Insert(cfg.Spec.Layers, 2, Layer{Type: "dropout", P: 0.3})
			}
			opt := func() Optimizer {
				if optName == "adam" {
					return NewAdam(1e-3)
				}
				return &SGD{LR: 0.05, Momentum: 0.9}
			}
			run := func(rep *Replica, start, steps, end int, after func(int, int) error) Summary {
				s, err := Run(context.Background(), RunConfig{Replica: rep, Train: loader(t, "train", batch, true),
					Epochs: end, StartEpoch: start, StartStep: steps, Classes: 10, AfterEpoch: after})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			straight := run(NewReplica(newMLP(t, cfg), opt(), solo(t)), 0, 0, 2, nil)

			path := filepath.Join(t.TempDir(), "ckpt")
			first := NewReplica(newMLP(t, cfg), opt(), solo(t))
			run(first, 0, 0, 1, func(epochs, steps int) error {
				return first.Snapshot(Checkpoint{Model: cfg, Epoch: epochs, Step: steps}).Save(path)
			})
			c, err := LoadCheckpoint(path)
			if err != nil {
				t.Fatal(err)
			}
			other := c.Model
			if !strings.Contains(optName, "dropout") {
				// The checkpoint must overwrite this init. (Dropout masks
				// hang on the model's seed too, so that run keeps it.)
				other.Seed = 99
			}
			second := NewReplica(newMLP(t, other), opt(), solo(t))
			if err := second.Restore(c); err != nil {
				t.Fatal(err)
			}
			resumed := run(second, c.Epoch, c.Step, 2, nil)
			if resumed.ParamHash != straight.ParamHash {
				t.Errorf("resumed run ends with %s; uninterrupted with %s", resumed.ParamHash, straight.ParamHash)
			}
		})
	}
}

func TestCheckpointDamage(t *testing.T) {
	cfg := mlpCfg(12, []int{8}, 3, 2, 1)
	rep := NewReplica(newMLP(t, cfg), NewAdam(1e-3), solo(t))
	x, y := randomBatch(rand.New(rand.NewPCG(1, 2)), 2, 12, 3)
	if _, err := rep.Step(context.Background(), x, y, 2); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "ckpt")
	if err := rep.Snapshot(Checkpoint{Model: cfg, Classes: []string{"a", "b", "c"}}).Save(path); err != nil {
		t.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	c, err := LoadCheckpoint(path)
	if err != nil || c.OptStep != 1 || len(c.OptState) != 8 || c.Classes[2] != "c" {
		t.Fatalf("LoadCheckpoint: %v; want Adam at step 1 with 8 state tensors (m and v of 4 parameters)", err)
	}
	if h := NewReplica(newMLP(t, cfg), NewAdam(1e-3), solo(t)); h.Restore(c) != nil || h.ParamHash() != rep.ParamHash() {
		t.Fatal("a replica restored from the checkpoint holds other parameters")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("Save left %d files; want only the checkpoint", len(entries))
	}
	damaged := []struct {
		name string
		b    []byte
	}{
		{"truncated", good[:len(good)-100]},
		{"flipped byte", func() []byte { b := append([]byte(nil), good...); b[len(b)/2] ^= 1; return b }()},
		{"empty", nil},
		{"not a checkpoint", []byte("hello, world, this is not a checkpoint at all..........")},
	}
	for _, d := range damaged {
		os.WriteFile(path, d.b, 0o644)
		if _, err := LoadCheckpoint(path); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("%s: LoadCheckpoint = %v; want ErrCheckpoint", d.name, err)
		}
	}
	wider := mlpCfg(12, []int{9}, 3, 2, 1)
	if err := c.LoadInto(newMLP(t, wider)); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("loading into another model = %v; want ErrCheckpoint", err)
	}
	if err := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, solo(t)).Restore(c); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("restoring Adam state into SGD = %v; want ErrCheckpoint", err)
	}
}
