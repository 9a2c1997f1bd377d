package train

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/pbnjay/memory"

	"github.com/ringtrain/ringtrain/data"
)

// ErrCheckpoint means a checkpoint file is damaged or does not fit.
var ErrCheckpoint = errors.New("train: bad checkpoint")

const checkpointMagic = "RTCKPT1\n"

// maxCheckpointHeader bounds the JSON header, read before anything is
// allocated from it.
const maxCheckpointHeader = 1 << 20

// Checkpoint is everything needed to resume a run or to predict: the model
// spec, parameters, optimizer state, where the run was, and the data setup.
type Checkpoint struct {
	Model ModelConfig `json:"model"`
	Epoch int         `json:"epoch"` // epochs completed
	Step  int         `json:"step"`  // steps completed in all
	// Skip is how many positions of epoch Epoch's permutation were trained
	// on, when the checkpoint was written in the middle of it.
	Skip       int                  `json:"skip,omitempty"`
	WorldSize  int                  `json:"world_size,omitempty"` // when it was written
	Seed       uint64               `json:"seed"`
	Classes    []string             `json:"classes"`
	Transforms []data.TransformSpec `json:"transforms"`
	Input      [3]int               `json:"input"` // C, H, W of a sample
	Optimizer  string               `json:"optimizer"`
	OptStep    int                  `json:"opt_step"`
	// Layers, if set, says the checkpoint holds one pipeline stage of the
	// model: the parameters of its layers [Layers[0], Layers[1]) alone.
	Layers   *[2]int     `json:"layers,omitempty"`
	Params   [][]float32 `json:"-"`
	OptState [][]float32 `json:"-"`
	// Feedback is the error feedback of a rank's sparse DiLoCo rounds, a
	// tensor per fragment (empty for one not coded yet): what its past
	// rounds left out, its own, so each peer's checkpoint holds its own.
	Feedback [][]float32 `json:"-"`
}

// header is what goes before the tensors: the checkpoint's fields and the
// lengths of its tensors.
type header struct {
	Checkpoint
	ParamLens    []int `json:"param_lens"`
	StateLens    []int `json:"state_lens"`
	FeedbackLens []int `json:"feedback_lens,omitempty"`
}

// Save writes c to path atomically: to a temporary file in the same
// folder, synced, then renamed over path, so a crash leaves the old
// checkpoint or the new one, never half of one. Layout: magic, 4-byte
// header length, JSON header, float32 tensors (little-endian), SHA-256 of
// all that precedes it.
func (c *Checkpoint) Save(path string) (err error) {
	h := header{Checkpoint: *c}
	for _, p := range c.Params {
		h.ParamLens = append(h.ParamLens, len(p))
	}
	for _, s := range c.OptState {
		h.StateLens = append(h.StateLens, len(s))
	}
	for _, f := range c.Feedback {
		h.FeedbackLens = append(h.FeedbackLens, len(f))
	}
	hb, err := json.Marshal(h)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	sum := sha256.New()
	w := io.MultiWriter(f, sum)
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(hb)))
	if _, err := w.Write(append(append([]byte(checkpointMagic), n[:]...), hb...)); err != nil {
		return err
	}
	buf := make([]byte, 0, 1<<16)
	for _, t := range slices.Concat(c.Params, c.OptState, c.Feedback) {
		for _, v := range t {
			buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			if len(buf) == cap(buf) {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
	}
	if _, err := w.Write(buf); err != nil {
		return err
	}
	if _, err := f.Write(sum.Sum(nil)); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	// The rename itself must reach the disk too.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// LoadCheckpoint reads and verifies a checkpoint: magic, header size, the
// tensors' lengths against the file's, and the checksum.
//
// Only a regular file is read, and only one that fits in this machine's
// memory: a FIFO would block the reader for good (and it ignored SIGTERM),
// /dev/zero would be read until memory ran out.
func LoadCheckpoint(path string) (*Checkpoint, error) {
	// Opened without blocking, then checked: a FIFO put in the file's
	// place after a Stat would block the open itself.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("train: checkpoint %s is not a regular file (%v): %w", path, st.Mode().Type(), ErrCheckpoint)
	}
	if mem := memory.TotalMemory(); mem > 0 && uint64(st.Size()) > mem {
		return nil, fmt.Errorf("train: checkpoint %s of %d bytes is larger than this machine's %d bytes of memory: %w", path, st.Size(), mem, ErrCheckpoint)
	}
	// What the file held when asked, and not a byte more should it grow.
	b, err := io.ReadAll(io.LimitReader(f, st.Size()))
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	return decodeCheckpoint(b, path)
}

// decodeCheckpoint reads a checkpoint from the bytes of the file path,
// every length checked against what the file holds before it is used.
func decodeCheckpoint(b []byte, path string) (*Checkpoint, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("train: checkpoint %s: %s: %w", path, fmt.Sprintf(format, args...), ErrCheckpoint)
	}
	if len(b) < len(checkpointMagic)+4+sha256.Size || string(b[:len(checkpointMagic)]) != checkpointMagic {
		return nil, fail("not a ringtrain checkpoint (or cut short before its header)")
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fail("checksum mismatch: the file is truncated or corrupt")
	}
	rest := body[len(checkpointMagic):]
	hl := binary.LittleEndian.Uint32(rest)
	if hl > maxCheckpointHeader || int(hl) > len(rest)-4 {
		return nil, fail("header of %d bytes does not fit", hl)
	}
	var h header
	if err := json.Unmarshal(rest[4:4+hl], &h); err != nil {
		return nil, fail("header: %v", err)
	}
	tensors := rest[4+hl:]
	total := 0
	for _, l := range slices.Concat(h.ParamLens, h.StateLens, h.FeedbackLens) {
		if l < 0 || l > len(tensors)/4 {
			return nil, fail("a tensor of %d values in %d bytes", l, len(tensors))
		}
		total += l
	}
	if total*4 != len(tensors) {
		return nil, fail("tensors hold %d bytes, header says %d", len(tensors), total*4)
	}
	c := h.Checkpoint
	// The model in the header must be one whose parameters are these
	// tensors: whoever builds it from this file then allocates no more than
	// the file holds.
	sizes, err := c.Model.Spec.ParamSizes()
	if err != nil {
		return nil, fail("its model: %v", err)
	}
	if c.Layers != nil {
		if sizes, err = c.Model.Spec.StageParamSizes(c.Layers[0], c.Layers[1]); err != nil {
			return nil, fail("its stage: %v", err)
		}
	}
	if !slices.Equal(sizes, h.ParamLens) {
		return nil, fail("its model has parameter tensors of %v values; the file holds %v", sizes, h.ParamLens)
	}
	read := func(lens []int) [][]float32 {
		var out [][]float32
		for _, l := range lens {
			t := make([]float32, l)
			for i := range t {
				t[i] = math.Float32frombits(binary.LittleEndian.Uint32(tensors[4*i:]))
			}
			tensors = tensors[4*l:]
			out = append(out, t)
		}
		return out
	}
	c.Params, c.OptState, c.Feedback = read(h.ParamLens), read(h.StateLens), read(h.FeedbackLens)
	return &c, nil
}

// ErrStageCheckpoint means a checkpoint holds one pipeline stage, not a
// model to predict with or export.
var ErrStageCheckpoint = errors.New("train: a pipeline stage's checkpoint, not a whole model")

// Whole says whether the checkpoint holds a whole model, and if not, what
// to use instead.
func (c *Checkpoint) Whole() error {
	if c.Layers != nil {
		return fmt.Errorf("layers [%d, %d) only; use the model file the pipeline job gathered (its name without .stageN): %w", c.Layers[0], c.Layers[1], ErrStageCheckpoint)
	}
	return nil
}

// LoadInto copies the checkpoint's parameters into m, refusing a checkpoint
// of another model.
func (c *Checkpoint) LoadInto(m Model) error {
	ps := m.Params()
	if len(ps) != len(c.Params) {
		return fmt.Errorf("train: checkpoint has %d parameter tensors, the model %d: %w", len(c.Params), len(ps), ErrCheckpoint)
	}
	for i, p := range ps {
		if len(p) != len(c.Params[i]) {
			return fmt.Errorf("train: checkpoint's %s has %d values, the model's %d: %w", m.ParamNames()[i], len(c.Params[i]), len(p), ErrCheckpoint)
		}
	}
	for i, p := range ps {
		copy(p, c.Params[i])
	}
	return nil
}
