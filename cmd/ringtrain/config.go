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
	"strings"
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
	// Data is the data config, inline or as a path to its file, or
	// {"served": "<dataset ID>"}: a dataset peers serve (ringtrain serve
	// prints its ID), whose transforms and classes come with it.
	Data json.RawMessage `json:"data"`
	// RequestSize is how many samples of a served dataset one request
	// asks for (Ember's request_size); default 256. Each machine's own.
	RequestSize int `json:"request_size"`
	// CacheDir, if set, keeps a served dataset's samples on this
	// machine's disk, so that a restart reads them locally.
	CacheDir      string `json:"cache_dir"`
	CheckpointDir string `json:"checkpoint_dir"`
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
	served    string        // the served dataset's ID, or ""
}

// maxRequestSize is the most samples a request may ask for: a data
// server's default limit (p2p.DataServerConfig.MaxRequest).
const maxRequestSize = 8192

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
	c, err := parseJobConfig(b, filepath.Dir(path), "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parseJobConfig reads a job config; relative paths are taken from dir.
// dataFile, if set, replaces its data section: a config handed out by
// another peer names no paths, and this machine says where its files are.
func parseJobConfig(b []byte, dir, dataFile string) (*jobConfig, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c jobConfig
	if err := dec.Decode(&c); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("more than one JSON value")
	}
	if dataFile != "" {
		abs, err := filepath.Abs(dataFile)
		if err != nil {
			return nil, err
		}
		if c.Data, err = json.Marshal(abs); err != nil {
			return nil, err
		}
	}
	if err := c.resolve(dir); err != nil {
		return nil, err
	}
	return &c, nil
}

// handedOutPath stands for the paths of a handed-out config's dataset,
// which are each machine's own.
const handedOutPath = "(each machine's own: join --data)"

// jobRef is how other peers name this job to fetch its config:
// name@config-hash.
func (c *jobConfig) jobRef() string { return c.Name + "@" + c.hash }

// parseJobRef splits name@hash.
func parseJobRef(s string) (name, hash string, err error) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 || !isHexSHA256(s[i+1:]) {
		return "", "", fmt.Errorf("--job %q; want <name>@<config hash> as ringtrain join --config prints it: %w", s, errUsage)
	}
	return s[:i], s[i+1:], nil
}

// handedOut is the config as peers hand it to those that join with
// --job: what every peer shares and nothing that is a machine's own
// (paths, timeouts, request size). Parsed, it has the same hash. A local
// dataset travels as its transforms and classes, and the peer that
// fetches it says with --data where its files are.
func (c *jobConfig) handedOut() ([]byte, error) {
	var dataSection any = map[string]string{"served": c.served}
	if c.served == "" {
		// The path only lets the config parse (paths are not in the
		// hash); join refuses to train on it without --data.
		dataSection = map[string]any{"transforms": c.data.Transforms, "classes": c.data.Classes,
			"dataset_path": map[string]string{"train": handedOutPath}}
	}
	mb := float64(c.bucket) / (1 << 20)
	return json.MarshalIndent(struct {
		Name          string          `json:"name"`
		WorldSize     int             `json:"world_size"`
		MinWorldSize  int             `json:"min_world_size"`
		GPUs          int             `json:"gpus,omitempty"`
		Epochs        int             `json:"epochs"`
		BatchSize     int             `json:"batch_size"`
		Seed          uint64          `json:"seed"`
		Model         json.RawMessage `json:"model"`
		Optimizer     any             `json:"optimizer"`
		Data          any             `json:"data"`
		GradNormGuard float64         `json:"grad_norm_guard,omitempty"`
		Compression   string          `json:"compression,omitempty"`
		BucketMB      float64         `json:"bucket_mb"`
		Sync          *syncConfig     `json:"sync,omitempty"`
	}{c.Name, c.WorldSize, c.MinWorldSize, c.GPUs, c.Epochs, c.BatchSize, c.Seed, c.Model, c.Optimizer, dataSection,
		c.GradNormGuard, c.Compression, mb, c.Sync}, "", "  ")
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
		return errors.New(`no data config; add "data": {"transforms": [...], "dataset_path": {...}}, "data": "<file>" or "data": {"served": "<dataset ID>"}`)
	}
	if c.RequestSize < 0 || c.RequestSize > maxRequestSize {
		return fmt.Errorf("request_size %d; want 1 to %d samples (0: 256)", c.RequestSize, maxRequestSize)
	}
	if c.RequestSize == 0 {
		c.RequestSize = 256
	}
	if c.CacheDir != "" && !filepath.IsAbs(c.CacheDir) && dir != "" {
		c.CacheDir = filepath.Join(dir, c.CacheDir)
	}
	var served struct {
		Served string `json:"served"`
	}
	dec := json.NewDecoder(bytes.NewReader(c.Data))
	dec.DisallowUnknownFields()
	if bytes.Contains(c.Data, []byte(`"served"`)) {
		if err := dec.Decode(&served); err != nil {
			return fmt.Errorf(`data: %w; a served dataset is named by its ID alone, {"served": "<ID>"}: its transforms and classes come with it`, err)
		}
		if _, err := data.ParseID(served.Served); err != nil {
			return fmt.Errorf("data: served: %w", err)
		}
		c.served = served.Served
		return c.computeHash()
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

// isHexSHA256 reports whether s looks like a config hash: a hex SHA-256.
func isHexSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}

// useServed takes a served dataset's transforms and classes, from its
// manifest, checked against the ID the config names.
func (c *jobConfig) useServed(m *data.Manifest) error {
	if m.ID() != c.served {
		return fmt.Errorf("served dataset %s is not the %s the job config names", m.ID()[:16], c.served[:16])
	}
	c.data = m.Config()
	return nil
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
		// A served dataset's ID stands for its transforms and classes,
		// and its bytes.
		Served string `json:",omitempty"`
	}{Name: c.Name, WorldSize: c.WorldSize, MinWorldSize: c.MinWorldSize, Epochs: c.Epochs, BatchSize: c.BatchSize, Seed: c.Seed,
		Model: c.Model, Optimizer: c.Optimizer, GradNormGuard: c.GradNormGuard, Wire: c.wire, BucketBytes: c.bucket, Sync: c.Sync, Served: c.served}
	if c.served == "" {
		shared.Transforms, shared.Classes = c.data.Transforms, c.data.Classes
	}
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
