package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// jobConfig is the job file. The names nodes (world_size), nr (rank) and
// gpus are those of the older tools it replaces, accepted as they are.
type jobConfig struct {
	Name      string `json:"name"`
	WorldSize int    `json:"world_size"`
	Nodes     int    `json:"nodes"` // = world_size
	Rank      *int   `json:"rank"`  // informational: ranks follow peer IDs
	Nr        *int   `json:"nr"`    // = rank
	GPUs      int    `json:"gpus"`  // 0: CPU; 1: the CUDA engine (see --device)
	Epochs    int    `json:"epochs"`
	BatchSize int    `json:"batch_size"` // per peer
	Seed      uint64 `json:"seed"`
	// Model is a built-in name ("mlp", "cnn") or a layer spec object
	// (train.Spec); its input may be left out, to be the data's shape.
	Model     json.RawMessage `json:"model"`
	Optimizer struct {
		Name        string  `json:"name"` // sgd or adam
		LR          float32 `json:"lr"`
		Momentum    float32 `json:"momentum"`
		WeightDecay float32 `json:"weight_decay"`
		Schedule    string  `json:"schedule"` // constant (default), step or cosine
		StepSize    int     `json:"step_size"`
		Gamma       float32 `json:"gamma"`
	} `json:"optimizer"`
	// Data is the data config, inline or as a path to its file.
	Data          json.RawMessage `json:"data"`
	CheckpointDir string          `json:"checkpoint_dir"`
	// CheckpointEvery, if set, also writes the checkpoint every that many
	// steps, not only after every epoch.
	CheckpointEvery int `json:"checkpoint_every"`
	// MinWorldSize is how few peers may carry on after others are lost;
	// default world_size, so that losing a peer stops the job.
	MinWorldSize int `json:"min_world_size"`
	// GradNormGuard, if set, skips every step where a rank's gradient norm
	// is over this many times the median's (train.Replica.NormGuard); 0,
	// the default, turns the guard off. More than 1.
	GradNormGuard float64 `json:"grad_norm_guard"`
	// Compression is how gradients travel in the ring: "none" (float32,
	// the default), "bf16" or "fp16" (half the bytes), "int8" (blockwise,
	// with error feedback: a little over a quarter; train.Replica.Wire).
	Compression string `json:"compression"`
	// BucketMB is the gradient bucket size in MB (train.Replica.BucketBytes):
	// the own engine sends each bucket while backward still computes the
	// layers before it. Default 25, as in PyTorch DDP; 0 sends all the
	// gradients in one allreduce after backward.
	BucketMB *float64 `json:"bucket_mb"`
	// Sync, if set, is DiLoCo (train.LocalSGD): every Every steps on its
	// own with the optimizer above, then the ranks average their
	// parameter changes and take an outer step.
	Sync        *syncConfig `json:"sync"`
	JoinTimeout duration    `json:"join_timeout"` // default 60s
	StepTimeout duration    `json:"step_timeout"` // default 60s

	data      *data.Config  // parsed Data
	modelName string        // a built-in name, or "" for a spec
	spec      *train.Spec   // a spec, or nil for a built-in
	hash      string        // of the fields every peer must share
	wire      ring.Encoding // parsed Compression
	bucket    int           // BucketMB in bytes
}

// syncConfig is "sync": {"every": H, "outer": {"name": "nesterov", "lr":
// 0.7, "momentum": 0.9}} — DiLoCo's published settings are those, with H
// in the hundreds for large models.
type syncConfig struct {
	Every int `json:"every"`
	Outer struct {
		Name     string  `json:"name"` // nesterov (default) or sgd
		LR       float32 `json:"lr"`
		Momentum float32 `json:"momentum"`
	} `json:"outer"`
}

// check says what is wrong with a sync section.
func (s *syncConfig) check() error {
	o := &s.Outer
	if o.Name == "" {
		o.Name = "nesterov"
	}
	switch {
	case s.Every < 1:
		return fmt.Errorf("sync every %d steps; want 1 or more", s.Every)
	case o.Name != "nesterov" && o.Name != "sgd":
		return fmt.Errorf("sync outer optimizer %q; want nesterov or sgd", o.Name)
	case !(o.LR > 0):
		return fmt.Errorf("sync outer lr %v; want a positive learning rate", o.LR)
	case !(o.Momentum >= 0 && o.Momentum < 1):
		return fmt.Errorf("sync outer momentum %v; want [0, 1)", o.Momentum)
	}
	return nil
}

// defaultBucketMB is PyTorch DDP's bucket_cap_mb.
const defaultBucketMB = 25

// duration reads "30s", "2m" and the like.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(v)
	return nil
}

// loadJobConfig reads and checks a job file. Unknown fields are errors
// naming them; a missing required field says what to add.
func loadJobConfig(path string) (*jobConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c jobConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := c.resolve(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

func (c *jobConfig) resolve(dir string) error {
	if c.Name == "" {
		return errors.New(`no job name; add "name": "<job>" (peers with the same name find each other)`)
	}
	switch {
	case c.WorldSize == 0 && c.Nodes == 0:
		return errors.New(`no world size; add "world_size": <number of peers> (or "nodes")`)
	case c.WorldSize != 0 && c.Nodes != 0 && c.WorldSize != c.Nodes:
		return fmt.Errorf("world_size %d and nodes %d disagree; give one", c.WorldSize, c.Nodes)
	case c.WorldSize == 0:
		c.WorldSize = c.Nodes
	}
	if c.WorldSize < 1 {
		return fmt.Errorf("world_size %d; want at least 1", c.WorldSize)
	}
	if c.Rank != nil && c.Nr != nil && *c.Rank != *c.Nr {
		return fmt.Errorf("rank %d and nr %d disagree; give one", *c.Rank, *c.Nr)
	}
	if c.GPUs < 0 {
		return fmt.Errorf("gpus %d; want 0 (CPU) or 1 (one GPU per peer)", c.GPUs)
	}
	if c.Epochs < 1 {
		return fmt.Errorf(`epochs %d; add "epochs": <at least 1>`, c.Epochs)
	}
	if c.BatchSize < 1 {
		return fmt.Errorf(`batch_size %d; add "batch_size": <samples per peer per step>`, c.BatchSize)
	}
	if err := c.parseModel(); err != nil {
		return err
	}
	switch c.Optimizer.Name {
	case "":
		c.Optimizer.Name, c.Optimizer.LR, c.Optimizer.Momentum = "sgd", 0.05, 0.9
	case "sgd", "adam":
		if c.Optimizer.LR <= 0 {
			return fmt.Errorf("optimizer %s has lr %v; want a positive learning rate", c.Optimizer.Name, c.Optimizer.LR)
		}
	default:
		return fmt.Errorf("optimizer %q is unknown; want sgd or adam", c.Optimizer.Name)
	}
	if err := c.schedule().Validate(); err != nil {
		return err
	}
	if c.MinWorldSize == 0 {
		c.MinWorldSize = c.WorldSize
	}
	wire, err := ring.ParseEncoding(c.Compression)
	if err != nil {
		return fmt.Errorf("compression: %w", err)
	}
	c.wire = wire
	if c.Sync != nil {
		if err := c.Sync.check(); err != nil {
			return err
		}
	}
	c.bucket = defaultBucketMB << 20
	if c.BucketMB != nil {
		if mb := *c.BucketMB; !(mb >= 0 && mb <= 1024) {
			return fmt.Errorf("bucket_mb %g; want 0 (one allreduce after backward) up to 1024", mb)
		}
		c.bucket = int(*c.BucketMB * (1 << 20))
	}
	if c.GradNormGuard != 0 && !(c.GradNormGuard > 1) {
		return fmt.Errorf("grad_norm_guard %g; want 0 (off) or a factor over 1", c.GradNormGuard)
	}
	if c.MinWorldSize < 1 || c.MinWorldSize > c.WorldSize {
		return fmt.Errorf("min_world_size %d; want between 1 and world_size %d", c.MinWorldSize, c.WorldSize)
	}
	if c.CheckpointEvery < 0 {
		return fmt.Errorf("checkpoint_every %d; want 0 (after every epoch only) or a number of steps", c.CheckpointEvery)
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = duration(60 * time.Second)
	}
	if c.StepTimeout == 0 {
		c.StepTimeout = duration(60 * time.Second)
	}
	if len(c.Data) == 0 {
		return errors.New(`no data config; add "data": {"transforms": [...], "dataset_path": {...}} or "data": "<file>"`)
	}
	var dataPath string
	if json.Unmarshal(c.Data, &dataPath) == nil {
		if !filepath.IsAbs(dataPath) {
			dataPath = filepath.Join(dir, dataPath)
		}
		c.data, err = data.LoadConfig(dataPath)
	} else {
		c.data, err = data.ParseConfig(bytes.NewReader(c.Data), dir)
	}
	if err != nil {
		return err
	}
	return c.computeHash()
}

// computeHash is the SHA-256 of the canonical form of what every peer must
// share: not the rank, the paths or the timeouts, which are each machine's.
// min_world_size is shared: peers that held different values would decide
// differently whether a ring that lost a peer carries on; so is
// grad_norm_guard, which sizes the step's allreduce.
func (c *jobConfig) computeHash() error {
	shared := struct {
		Name         string
		WorldSize    int
		MinWorldSize int
		Epochs       int
		BatchSize    int
		Seed         uint64
		Model        json.RawMessage
		Optimizer    any
		Transforms   []data.TransformSpec
		Classes      []string
		// Left out when 0, so that a config without the guard keeps the
		// hash it had before the guard existed.
		GradNormGuard float64       `json:",omitempty"`
		Wire          ring.Encoding `json:",omitempty"`
		// Always there: buckets change the collectives a step calls, so
		// peers from before them (one allreduce a step) must not agree.
		BucketBytes int
		Sync        *syncConfig `json:",omitempty"`
	}{c.Name, c.WorldSize, c.MinWorldSize, c.Epochs, c.BatchSize, c.Seed, c.Model, c.Optimizer, c.data.Transforms, c.data.Classes, c.GradNormGuard, c.wire, c.bucket, c.Sync}
	b, err := json.Marshal(shared)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	c.hash = hex.EncodeToString(sum[:])
	return nil
}

// parseModel reads "model": a built-in name or a layer spec.
func (c *jobConfig) parseModel() error {
	if len(c.Model) == 0 {
		return errors.New(`no model; add "model": "mlp" (or "cnn", or a layer spec)`)
	}
	if json.Unmarshal(c.Model, &c.modelName) == nil {
		if _, err := train.BuiltinSpec(c.modelName, 1, 28, 28, 10); err != nil {
			return fmt.Errorf("model %q is unknown; built in: mlp, cnn (or give a layer spec)", c.modelName)
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(c.Model))
	dec.DisallowUnknownFields()
	var s train.Spec
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("model spec: %w", err)
	}
	c.spec = &s
	return nil
}

// modelSpec is the model for samples of C×H×W and the given classes; a
// spec without an input takes the data's shape, and it is checked here, with
// errors naming the layer.
func (c *jobConfig) modelSpec(ch, h, w, classes int) (train.Spec, error) {
	if c.spec == nil {
		return train.BuiltinSpec(c.modelName, ch, h, w, classes)
	}
	s := *c.spec
	if len(s.Input) == 0 {
		s.Input = []int{ch, h, w}
		if len(s.Layers) > 0 && s.Layers[0].Type == "linear" {
			s.Input = []int{ch * h * w}
		}
	}
	if _, err := s.Shapes(); err != nil {
		return s, fmt.Errorf("model spec: %w", err)
	}
	return s, nil
}

// overrideModel replaces the config's model with a built-in one, as
// --model asks; every peer must be given the same.
func (c *jobConfig) overrideModel(name string) error {
	b, err := json.Marshal(name)
	if err != nil {
		return err
	}
	c.Model, c.spec = b, nil
	if err := c.parseModel(); err != nil {
		return err
	}
	return c.computeHash()
}

// schedule is the optimizer's learning-rate schedule over the job's epochs.
func (c *jobConfig) schedule() train.Schedule {
	o := c.Optimizer
	return train.Schedule{Kind: o.Schedule, Base: o.LR, Epochs: c.Epochs, StepSize: o.StepSize, Gamma: o.Gamma}
}
