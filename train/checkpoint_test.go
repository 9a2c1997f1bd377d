package train

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

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

// TestResumeEqualsUninterrupted: two epochs straight, against a run that
// writes checkpoints (every epoch and every 7 steps) and is stopped in
// epoch 2, then a fresh process's worth of objects loading its last
// checkpoint and running to the end — the same parameters, bit for bit, for
// SGD with momentum and Adam, and with dropout, whose masks must come out as
// they would have. Stopped at epoch 2's step 3 the last checkpoint is the
// epoch boundary; at step 20, one from the middle of the epoch.
func TestResumeEqualsUninterrupted(t *testing.T) {
	const batch = 32
	for _, optName := range []string{"sgd", "adam", "adam+dropout"} {
		for _, stopAt := range []int{3, 20} {
			t.Run(fmt.Sprintf("%s/stopped at epoch 2 step %d", optName, stopAt), func(t *testing.T) {
				cfg := mlpCfg(784, []int{32}, 10, batch, 4)
				if optName == "adam+dropout" {
					cfg.Spec.Layers = slices.Insert(cfg.Spec.Layers, 2, Layer{Type: "dropout", P: 0.3})
				}
				opt := func() Optimizer {
					if optName == "sgd" {
						return &SGD{LR: 0.05, Momentum: 0.9}
					}
					return NewAdam(1e-3)
				}
				run := func(rc RunConfig) (Summary, error) {
					rc.Train, rc.Epochs, rc.Classes = loader(t, "train", batch, true), 2, 10
					return Run(context.Background(), rc)
				}
				straight, err := run(RunConfig{Replica: NewReplica(newMLP(t, cfg), opt(), solo(t))})
				if err != nil {
					t.Fatal(err)
				}

				path := filepath.Join(t.TempDir(), "ckpt")
				first := NewReplica(newMLP(t, cfg), opt(), solo(t))
				stop := make(chan struct{})
				var saved []Position
				_, err = run(RunConfig{Replica: first, SaveEvery: 7, Stop: stop, ProgressEvery: 1,
					Save: func(p Position) error {
						saved = append(saved, p)
						return first.Snapshot(Checkpoint{Model: cfg, Epoch: p.Epochs, Step: p.Steps, Skip: p.Skip}).Save(path)
					},
					Progress: func(p Progress) {
						if p.Epoch == 1 && p.Step == stopAt {
							close(stop)
						}
					}})
				if !errors.Is(err, ErrStopped) {
					t.Fatalf("interrupted run: %v; want ErrStopped", err)
				}
				c, err := LoadCheckpoint(path)
				if err != nil {
					t.Fatal(err)
				}
				if last := saved[len(saved)-1]; (stopAt == 3) != (last.Skip == 0) || c.Skip != last.Skip {
					t.Fatalf("last checkpoint at %+v (file says skip %d); want the epoch boundary when stopped at step 3, else mid-epoch", last, c.Skip)
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
				resumed, err := run(RunConfig{Replica: second, Start: Position{Epochs: c.Epoch, Steps: c.Step, Skip: c.Skip}})
				if err != nil {
					t.Fatal(err)
				}
				if resumed.ParamHash != straight.ParamHash || resumed.Position != straight.Position {
					t.Errorf("resumed run ends at %+v with %s; uninterrupted at %+v with %s", resumed.Position, resumed.ParamHash, straight.Position, straight.ParamHash)
				}
			})
		}
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
	// A header whose model is not the one the tensors belong to — a huge
	// one, say — is refused on load, before anyone builds that model.
	liar := *c
	liar.Model.Spec = MLPSpec(12, []int{1 << 20}, 3)
	if err := liar.Save(path); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(path); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "parameter tensors") {
		t.Errorf("a header naming another model: LoadCheckpoint = %v; want ErrCheckpoint about its tensors", err)
	}
	wider := mlpCfg(12, []int{9}, 3, 2, 1)
	if err := c.LoadInto(newMLP(t, wider)); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("loading into another model = %v; want ErrCheckpoint", err)
	}
	if err := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, solo(t)).Restore(c); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("restoring Adam state into SGD = %v; want ErrCheckpoint", err)
	}
}

// FuzzCheckpoint feeds the checkpoint reader whatever a file may hold —
// as it is, and resealed with a valid checksum so that the fuzzer reaches
// the header and tensors: a checkpoint or ErrCheckpoint, never a panic or
// an allocation larger than the file.
func FuzzCheckpoint(f *testing.F) {
	cfg := mlpCfg(4, []int{3}, 2, 2, 1)
	sizes, err := cfg.Spec.ParamSizes()
	if err != nil {
		f.Fatal(err)
	}
	c := Checkpoint{Model: cfg, Classes: []string{"a", "b"}, Epoch: 1, Step: 2}
	for _, n := range sizes {
		c.Params = append(c.Params, make([]float32, n))
	}
	path := filepath.Join(f.TempDir(), "ckpt")
	if err := c.Save(path); err != nil {
		f.Fatal(err)
	}
	good, _ := os.ReadFile(path)
	f.Add(good[:len(good)-sha256.Size])
	f.Add([]byte(checkpointMagic))
	f.Fuzz(func(t *testing.T, body []byte) {
		sum := sha256.Sum256(body)
		for _, b := range [][]byte{body, append(body[:len(body):len(body)], sum[:]...)} {
			got, err := decodeCheckpoint(b, "fuzz")
			if err != nil {
				if !errors.Is(err, ErrCheckpoint) {
					t.Fatalf("error %v is not ErrCheckpoint", err)
				}
				continue
			}
			n := 0
			for _, p := range slices.Concat(got.Params, got.OptState) {
				n += len(p)
			}
			if 4*n > len(b) {
				t.Fatalf("%d values from %d bytes", n, len(b))
			}
		}
	})
}

// TestCheckpointNotARegularFile: a FIFO, a directory and /dev/zero are
// refused at once, saying why. Before, /dev/zero was read until memory
// ran out, and a FIFO blocked the reader for good.
func TestCheckpointNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFO here: %v", err)
	}
	for _, path := range []string{fifo, dir, "/dev/zero"} {
		done := make(chan error, 1)
		go func() { _, err := LoadCheckpoint(path); done <- err }()
		select {
		case err := <-done:
			if !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("%s: %v; want ErrCheckpoint saying it is not a regular file", path, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: LoadCheckpoint still reading after 10 s", path)
		}
	}
}
