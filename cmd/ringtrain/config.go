package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/pipeline"
	"github.com/ringtrain/ringtrain/train/sparse"
)

// jobConfig is a job as this peer runs it: the job's definition, which
// every peer shares and which alone travels to peers that join with --job,
// and this machine's own settings, which never travel. They are two types
// so that no code path can take a path, a timeout or a request size from
// another peer by forgetting which is which.
type jobConfig struct {
	jobSpec
	localSettings

	data      *data.Config  // transforms and classes, and for local files this machine's paths
	modelName string        // a built-in name, or "" for a spec
	spec      *train.Spec   // a spec, or nil for a built-in
	hash      string        // hex SHA-256 of the spec's canonical JSON
	wire      ring.Encoding // parsed Compression
	order     p2p.RingOrder // parsed RingOrder
}

// jobSpec is what defines a job: what every peer must share. Its canonical
// JSON (encode) is what a peer hands to those that join with --job, and
// the SHA-256 of exactly those bytes is the job's config hash, which hellos
// prove and name@hash names — so a fetched config is checked before a byte
// of it is parsed. Defaults are written out in it, so that a config that
// leaves a field at its default and one that spells it out are one job.
type jobSpec struct {
	Name         string `json:"name"`
	WorldSize    int    `json:"world_size"`
	MinWorldSize int    `json:"min_world_size"`
	// MaxWorldSize is how many peers the ring may grow to as newcomers
	// are admitted (Elastic Horovod's max_np); default world_size.
	MaxWorldSize int    `json:"max_world_size"`
	Epochs       int    `json:"epochs"`
	BatchSize    int    `json:"batch_size"` // per peer
	Seed         uint64 `json:"seed"`
	// Model is a built-in name ("mlp", "cnn") or a layer spec object
	// (train.Spec); its input may be left out, to be the data's shape.
	Model json.RawMessage `json:"model"`
	// Loss is cross_entropy (the default), or mse or bce against a CSV
	// table's target columns (train.Loss).
	Loss      string          `json:"loss,omitempty"`
	Optimizer optimizerConfig `json:"optimizer"`
	Data      dataSpec        `json:"data"`
	// GradNormGuard, if set, skips every step where a rank's gradient norm
	// is over this many times the median's (train.Replica.NormGuard); 0,
	// the default, turns the guard off. More than 1.
	GradNormGuard float64 `json:"grad_norm_guard,omitempty"`
	// EvalEvery, if set, scores the test set every that many steps too
	// (train.RunConfig.EvalEvery): every peer takes part.
	EvalEvery int `json:"eval_every,omitempty"`
	// Compression is how gradients travel in the ring: "" (float32),
	// "bf16" or "fp16" (half the bytes), "int8" (blockwise, with error
	// feedback: a little over a quarter; train.Replica.Wire).
	Compression string `json:"compression,omitempty"`
	// RingOrder is how the ring's members are ranked: "measured" (the
	// default, written "") by the links they measure at each formation,
	// or "id" by peer ID (p2p.RingOrder).
	RingOrder string `json:"ring_order,omitempty"`
	// BucketBytes is the gradient bucket size (train.Replica.BucketBytes),
	// bucket_mb in the file: buckets change the collectives a step calls.
	BucketBytes int `json:"bucket_bytes"`
	// Sync, if set, is DiLoCo (train.LocalSGD): every Every steps on its
	// own with the optimizer above, then the ranks average their
	// parameter changes and take an outer step.
	Sync *syncConfig `json:"sync,omitempty"`
	// NonIIDShards, if above 0, deals the training set's samples by label
	// modulo this many groups (data.Sampler.Groups): with as many peers,
	// each trains mostly on its own labels — shards that differ, to try
	// what honest peers with other data send. 0, the default, shuffles.
	NonIIDShards int `json:"non_iid_shards,omitempty"`
	// UpdateChecks, if set, sends a sketch of each peer's gradients with
	// every step, to skip a step whose sum a forwarder altered and name a
	// peer whose gradients stand far apart (train.Sketch); not with sync
	// or pipeline.
	UpdateChecks *updateChecks `json:"update_checks,omitempty"`
	// Pipeline, if set, cuts the model's layers into stages held by
	// different peers (elastic.PipelineJob); its schedule and boundary
	// are written out.
	Pipeline *pipeline.Config `json:"pipeline,omitempty"`
}

// optimizerConfig is the job's optimizer and its learning-rate schedule.
type optimizerConfig struct {
	Name        string  `json:"name"` // sgd, adam or adamw
	LR          float32 `json:"lr"`
	Momentum    float32 `json:"momentum"`
	WeightDecay float32 `json:"weight_decay"`
	Schedule    string  `json:"schedule"` // constant (default), step or cosine
	StepSize    int     `json:"step_size"`
	Gamma       float32 `json:"gamma"`
	// Betas and Eps are Adam's and AdamW's (torch's names); left out,
	// Adam's (0.9, 0.999) and AdamW's (0.9, 0.95), eps 1e-8.
	Betas []float32 `json:"betas,omitempty"`
	Eps   float32   `json:"eps,omitempty"`
	// WarmupSteps makes the rate rise linearly over the first steps;
	// TotalSteps runs a cosine schedule over steps, down to MinLR.
	WarmupSteps int     `json:"warmup_steps,omitempty"`
	TotalSteps  int     `json:"total_steps,omitempty"`
	MinLR       float32 `json:"min_lr,omitempty"`
	// ClipGradNorm, if set, clips the averaged gradients to this global
	// norm before every update (train.Replica.ClipNorm).
	ClipGradNorm float64 `json:"clip_grad_norm,omitempty"`
}

// dataSpec is the data as a job's definition names it: a served dataset
// by its ID (which stands for its transforms, classes and bytes), or, for
// files each machine holds, their transforms and classes — never a path.
type dataSpec struct {
	Served     string               `json:"served,omitempty"`
	Transforms []data.TransformSpec `json:"transforms,omitempty"`
	Classes    []string             `json:"classes,omitempty"`
	// Text says the job trains on a text corpus, as bytes: where it is is
	// each machine's own, as image files' paths are.
	Text bool `json:"text,omitempty"`
	// Targets names a CSV table's target columns, as the data config does.
	Targets []string `json:"targets,omitempty"`
}

// localSettings are this machine's own: where its files go, how long it
// waits, how it asks for data, what it computes on. They are read from the
// job file and the flags of the peer that runs it, never from another
// peer, and are not part of the job's hash.
type localSettings struct {
	GPUs int `json:"gpus"` // 0: CPU; 1: the CUDA engine (see --device)
	// RequestSize is how many samples of a served dataset one request
	// asks for (Ember's request_size); default 256.
	RequestSize int `json:"request_size"`
	// CacheDir, if set, keeps a served dataset's samples on this
	// machine's disk, so that a restart reads them locally.
	CacheDir string `json:"cache_dir"`
	// CheckpointDir, if set, is where this peer writes its checkpoint and
	// looks for one to resume from.
	CheckpointDir string `json:"checkpoint_dir"`
	// CheckpointEvery, if set, also writes the checkpoint every that many
	// steps, not only after every epoch.
	CheckpointEvery int      `json:"checkpoint_every"`
	JoinTimeout     duration `json:"join_timeout"` // default 60s
	StepTimeout     duration `json:"step_timeout"` // default 60s
	// AdmissionTimeout bounds each collective that brings a newcomer up
	// to date: one that stalls mid-admission is dropped within it.
	AdmissionTimeout duration `json:"admission_timeout"` // default 10s
	// DataMemory bounds the bytes a served dataset may take in this
	// peer's memory (join --data-memory); 0 means data.DefaultMaxBytes.
	DataMemory int64 `json:"-"`
	// Limits bound what any one peer may ask of this one.
	Limits limitsConfig `json:"limits"`
}

// limitsConfig is "limits": p2p.Limits as the file spells them. Zero
// fields take p2p's defaults.
type limitsConfig struct {
	RequestsPerSecond float64  `json:"requests_per_second"`
	Burst             int      `json:"burst"`
	StreamsPerPeer    int      `json:"streams_per_peer"`
	Strikes           int      `json:"strikes"`
	BanFor            duration `json:"ban_for"`
	MaxBanned         int      `json:"max_banned"`
	ConnsPerIP        int      `json:"conns_per_ip"`
	NewConnsPerIP     int      `json:"new_conns_per_ip"`
	PeerStreams       int      `json:"peer_streams"`
	PeerMemoryMB      int64    `json:"peer_memory_mb"`
	DHTMessagesPerSec float64  `json:"dht_messages_per_second"`
	DHTMessageBurst   int      `json:"dht_message_burst"`
	// The data server's (join --serve), p2p.DataServerConfig's.
	DataSamplesPerRequest int `json:"data_samples_per_request"`
	DataStreams           int `json:"data_streams"`
	DataStreamsPerPeer    int `json:"data_streams_per_peer"`
	DataStreamsPerIP      int `json:"data_streams_per_ip"`
	DataMBPerSecond       int `json:"data_mb_per_second_per_peer"`
}

func (l limitsConfig) p2p() p2p.Limits {
	return p2p.Limits{RequestsPerSecond: l.RequestsPerSecond, Burst: l.Burst, StreamsPerPeer: l.StreamsPerPeer,
		Strikes: l.Strikes, BanFor: time.Duration(l.BanFor), MaxBanned: l.MaxBanned, ConnsPerIP: l.ConnsPerIP, ConnBurstPerIP: l.NewConnsPerIP,
		PeerStreams: l.PeerStreams, PeerMemory: l.PeerMemoryMB << 20, DHTMessagesPerSecond: l.DHTMessagesPerSec, DHTMessageBurst: l.DHTMessageBurst}
}

// dataServer is what the limits say of a data server; zero fields take
// p2p's defaults.
func (l limitsConfig) dataServer() p2p.DataServerConfig {
	return p2p.DataServerConfig{MaxRequest: l.DataSamplesPerRequest, MaxStreams: l.DataStreams, MaxPerPeer: l.DataStreamsPerPeer,
		MaxPerIP: l.DataStreamsPerIP, PeerBytesPerSecond: int64(l.DataMBPerSecond) << 20}
}

// p2pJob is what the job's peers must agree on to form a ring, and the
// smallest ring it trains on: min_world_size, or a pipeline's stages,
// one peer each, however many replicas it began with.
func (c *jobConfig) p2pJob() p2p.Job {
	smallest := c.MinWorldSize
	if c.Pipeline != nil {
		smallest = c.Pipeline.Stages
	}
	return p2p.Job{Name: c.Name, ConfigHash: c.hash, WorldSize: c.WorldSize, MaxWorldSize: c.MaxWorldSize, MinWorldSize: smallest}
}

// check says which of the limits is out of range.
func (l limitsConfig) check() error {
	if err := l.p2p().Check(); err != nil {
		return err
	}
	switch {
	case l.PeerMemoryMB > 1<<20:
		return fmt.Errorf("peer_memory_mb %d: want 0 (libp2p's default) to %d", l.PeerMemoryMB, 1<<20)
	case l.DataSamplesPerRequest < 0 || l.DataSamplesPerRequest > 1<<20:
		return fmt.Errorf("data_samples_per_request %d: want 0 (default 8192) to %d", l.DataSamplesPerRequest, 1<<20)
	case l.DataStreams < 0 || l.DataStreams > 1<<16:
		return fmt.Errorf("data_streams %d: want 0 (default 64) to %d", l.DataStreams, 1<<16)
	case l.DataMBPerSecond < 0 || l.DataMBPerSecond > 1<<20:
		return fmt.Errorf("data_mb_per_second_per_peer %d: want 0 (default 64) to %d", l.DataMBPerSecond, 1<<20)
	case l.DataStreamsPerPeer < 0 || l.DataStreamsPerPeer > 1<<16:
		return fmt.Errorf("data_streams_per_peer %d: want 0 (default 8) to %d", l.DataStreamsPerPeer, 1<<16)
	case l.DataStreamsPerIP < 0 || l.DataStreamsPerIP > 1<<16:
		return fmt.Errorf("data_streams_per_ip %d: want 0 (default 16) to %d", l.DataStreamsPerIP, 1<<16)
	}
	return nil
}

// jobFile is the job file as users write it. The names nodes
// (world_size), nr (rank) and gpus are those of the older tools it
// replaces, accepted as they are. Its data is a data config, inline or as
// a path to its file, or {"served": "<dataset ID>"}.
// maxWorldSize bounds a ring: what a member's peer lists and per-peer
// state are sized for.
const maxWorldSize = 1024

type jobFile struct {
	Name          string          `json:"name"`
	WorldSize     int             `json:"world_size"`
	Nodes         int             `json:"nodes"` // = world_size
	Rank          *int            `json:"rank"`  // informational: ranks follow the ring order
	Nr            *int            `json:"nr"`    // = rank
	Epochs        int             `json:"epochs"`
	BatchSize     int             `json:"batch_size"`
	Seed          uint64          `json:"seed"`
	Model         json.RawMessage `json:"model"`
	Loss          string          `json:"loss"`
	Optimizer     optimizerConfig `json:"optimizer"`
	Data          json.RawMessage `json:"data"`
	MinWorldSize  int             `json:"min_world_size"`
	MaxWorldSize  int             `json:"max_world_size"`
	GradNormGuard float64         `json:"grad_norm_guard"`
	EvalEvery     int             `json:"eval_every"`
	Compression   string          `json:"compression"`
	RingOrder     string          `json:"ring_order"`
	// BucketMB is the gradient bucket size in MB: the own engine sends
	// each bucket while backward still computes the layers before it.
	// Default 25, as in PyTorch DDP; 0 sends all the gradients in one
	// allreduce after backward.
	BucketMB *float64    `json:"bucket_mb"`
	Sync     *syncConfig `json:"sync"`
	// UpdateChecks and NonIIDShards: see jobSpec.
	UpdateChecks *updateChecks    `json:"update_checks"`
	NonIIDShards int              `json:"non_iid_shards"`
	Pipeline     *pipeline.Config `json:"pipeline"`
	localSettings
}

// maxRequestSize is the most samples a request may ask for: a data
// server's default limit (p2p.DataServerConfig.MaxRequest).
const maxRequestSize = 8192

// syncConfig is "sync": {"every": H, "outer": {"name": "nesterov", "lr":
// 0.7, "momentum": 0.9}} — DiLoCo's published settings are those, with H
// in the hundreds for large models. Without "outer" the outer step is a
// plain average (sgd, lr 1, no momentum): on the mlp here it reached
// synchronous training's accuracy where Nesterov's settings fell short
// and then fell (train/RESULTS.md).
type syncConfig struct {
	Every int `json:"every"`
	Outer struct {
		Name     string  `json:"name"` // nesterov (default) or sgd
		LR       float32 `json:"lr"`
		Momentum float32 `json:"momentum"`
	} `json:"outer"`
	// Sparse is "sparse": {"fraction": 0.01, "bits": 2}: each peer's
	// pseudo-gradient as its top entries in a few bits, with error
	// feedback (train/sparse).
	Sparse *struct {
		Fraction float64 `json:"fraction"`
		Bits     int     `json:"bits"`
	} `json:"sparse"`
	// Fragments and Overlap stream the outer sync (train.LocalSGD): the
	// parameters in this many fragments, each with its outer step every
	// Every steps in turn, each exchange running beside Overlap inner
	// steps. Left out, the whole model syncs at once and is waited for.
	Fragments int `json:"fragments,omitempty"`
	Overlap   int `json:"overlap,omitempty"`
	// Deadline, if set, closes each round without a peer slow to compute
	// (train.LocalSGD's Deadline), with at least min_world_size peers in.
	Deadline duration `json:"deadline,omitempty"`
	// Robust, with sparse, aggregates the gathered pseudo-gradients by
	// CenteredClip instead of the mean (train.Robust): {} takes clip 2
	// and 3 iterations, and names (then drops) a peer whose update stood
	// apart in 3 rounds in a row.
	Robust *robustConfig `json:"robust,omitempty"`
}

// updateChecks is "update_checks": {"dims": 32, "window": 16,
// "name_after": 3, "name_above": 3, "audit_every": 0, "suspect_below":
// -0.3}, written out in full once checked; name_after 0 never names,
// audit_every 0 never audits (train.Sketch.AuditEvery: every peer
// recomputes one peer's gradients one step in this many, and as many
// again for peers whose gradients lean against the others' below
// suspect_below; -1 audits no suspect).
type updateChecks struct {
	Dims         int     `json:"dims"`
	Window       int     `json:"window"`
	NameAfter    *int    `json:"name_after,omitempty"`
	NameAbove    float64 `json:"name_above"`
	AuditEvery   int     `json:"audit_every"`
	SuspectBelow float64 `json:"suspect_below"`
}

// check fills in the defaults and says what is wrong; nil is no section.
// The checks sketch the gradients of a ring that syncs every step: not
// with DiLoCo rounds or pipeline stages (notEveryStep).
func (u *updateChecks) check(notEveryStep bool) error {
	if u == nil {
		return nil
	}
	if notEveryStep {
		return errors.New(`update_checks sketch the gradients of a ring that syncs every step; with "sync", "robust" judges the peers' updates, and "pipeline" has none to check`)
	}
	u.fill()
	if err := u.sketch().Validate(); err != nil {
		return fmt.Errorf("update_checks: %w", err)
	}
	return nil
}

// fill writes the defaults out, so that the config hash holds them.
func (u *updateChecks) fill() {
	if u.Dims == 0 {
		u.Dims = 32
	}
	if u.Window == 0 {
		u.Window = 16
	}
	if u.NameAfter == nil {
		three := 3
		u.NameAfter = &three
	}
	if u.NameAbove == 0 {
		u.NameAbove = 3
	}
	if u.SuspectBelow == 0 {
		u.SuspectBelow = -0.3
	}
}

// sketch is the section as train takes it (after fill).
func (u *updateChecks) sketch() *train.Sketch {
	s := &train.Sketch{Dims: u.Dims, Window: u.Window, NameAbove: u.NameAbove, AuditEvery: u.AuditEvery, SuspectBelow: u.SuspectBelow}
	if u.NameAfter != nil {
		s.NameAfter = *u.NameAfter
	}
	return s
}

// robustConfig is "robust": {"clip": 2, "iters": 3, "name_after": 3,
// "name_above": 3}, written out in full; name_after 0 never names.
type robustConfig struct {
	Clip      float64 `json:"clip"`
	Iters     int     `json:"iters"`
	NameAfter *int    `json:"name_after,omitempty"`
	NameAbove float64 `json:"name_above,omitempty"`
}

// robust is the section as train takes it.
func (r *robustConfig) robust() *train.Robust {
	rb := &train.Robust{Clip: r.Clip, Iters: r.Iters, NameAfter: 3, NameAbove: r.NameAbove} // as check writes them out
	if r.NameAfter != nil {
		rb.NameAfter = *r.NameAfter
	}
	return rb
}

// sparse is the sparse section as train/sparse takes it; nil without one.
func (s *syncConfig) sparse() *sparse.Config {
	if s.Sparse == nil {
		return nil
	}
	return &sparse.Config{Fraction: s.Sparse.Fraction, Bits: s.Sparse.Bits}
}

// check says what is wrong with a sync section.
func (s *syncConfig) check() error {
	o := &s.Outer
	if o.Name == "" && o.LR == 0 && o.Momentum == 0 {
		o.Name, o.LR = "sgd", 1
	}
	if o.Name == "" {
		o.Name = "nesterov"
	}
	if o.Name != "nesterov" && o.Name != "sgd" {
		return fmt.Errorf("sync outer optimizer %q; want nesterov or sgd", o.Name)
	}
	if r := s.Robust; r != nil {
		if s.Sparse == nil {
			return errors.New(`sync robust aggregates each peer's pseudo-gradient apart, which only "sparse" rounds gather; add "sparse"`)
		}
		if r.Clip == 0 && r.Iters == 0 {
			r.Clip, r.Iters = 2, 3
		}
		// Written out, so that the config hash holds them: peers that
		// would name other ranks cannot share a ring.
		if r.NameAfter == nil {
			three := 3
			r.NameAfter = &three
		}
		if r.NameAbove == 0 {
			r.NameAbove = 3
		}
		if err := r.robust().Validate(); err != nil {
			return fmt.Errorf("sync robust: %w", err)
		}
	}
	return nil
}

// localSGD is the sync section as train takes it, with inner as the
// optimizer of the inner steps and quorum the fewest peers a round with
// a deadline closes with (min_world_size).
func (s *syncConfig) localSGD(inner train.Optimizer, quorum int) *train.LocalSGD {
	return &train.LocalSGD{Inner: inner, Every: s.Every, LR: s.Outer.LR, Momentum: s.Outer.Momentum, Nesterov: s.Outer.Name == "nesterov",
		Sparse: s.sparse(), Fragments: s.Fragments, Overlap: s.Overlap, Deadline: time.Duration(s.Deadline), Quorum: quorum, Robust: s.robust()}
}

// robust is the robust section as train takes it; nil without one.
func (s *syncConfig) robust() *train.Robust {
	if s.Robust == nil {
		return nil
	}
	return s.Robust.robust()
}

// defaultBucketMB is PyTorch DDP's bucket_cap_mb.
const defaultBucketMB = 25

// duration reads "30s", "2m" and the like, and writes itself so.
type duration time.Duration

// MarshalJSON writes the duration as UnmarshalJSON reads it: a handed-out
// job config parses back into the same job.
func (d duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

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

// maxJobFileBytes bounds a job or data config file: a path that names a
// device or a huge file is an error, not all of this machine's memory.
const maxJobFileBytes = 1 << 20

// loadJobConfig reads and checks a job file. Unknown fields are errors
// naming them; a missing required field says what to add.
func loadJobConfig(path string) (*jobConfig, error) {
	b, err := data.ReadConfigFile(path, maxJobFileBytes)
	if err != nil {
		return nil, err
	}
	c, err := parseJobFile(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// parseJobFile reads a job file; relative paths are taken from dir.
func parseJobFile(b []byte, dir string) (*jobConfig, error) {
	var f jobFile
	if err := decodeStrict(b, &f); err != nil {
		return nil, err
	}
	return f.resolve(dir)
}

// decodeStrict decodes one JSON value into v, refusing unknown fields and
// anything after the value.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

// ErrConfigHash means a peer handed out a config that is not the one the
// job's name@hash names.
var ErrConfigHash = errors.New("job config does not hash to the job's hash")

// parseHandedOut reads the config a peer handed out for name@hash. The
// bytes must hash to hash before anything is read from them, and be a job
// spec in its canonical form: what a peer hands out can define a job and
// nothing else — no path, no timeout, nothing about this machine. local
// are this machine's settings; dataFile, for a job on local files, this
// machine's data config, whose transforms and classes must be the job's.
func parseHandedOut(b []byte, name, hash string, local localSettings, dataFile string) (*jobConfig, error) {
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hash {
		return nil, fmt.Errorf("%d bytes hashing to %s, not %s: %w", len(b), hex.EncodeToString(sum[:8]), hash[:min(16, len(hash))], ErrConfigHash)
	}
	c := &jobConfig{localSettings: local}
	if err := decodeStrict(b, &c.jobSpec); err != nil {
		return nil, fmt.Errorf("handed-out job config: %w", err)
	}
	if err := c.resolveSpec(); err != nil {
		return nil, fmt.Errorf("handed-out job config: %w", err)
	}
	if again, err := c.encode(); err != nil || !bytes.Equal(again, b) {
		return nil, fmt.Errorf("handed-out job config is not in its canonical form: %w", ErrConfigHash)
	}
	if c.Name != name {
		return nil, fmt.Errorf("handed-out job config is of job %q, not %q: %w", c.Name, name, ErrConfigHash)
	}
	if err := c.localSettings.check(""); err != nil {
		return nil, err
	}
	if c.Data.Served != "" {
		if dataFile != "" {
			return nil, fmt.Errorf("job %q trains on the served dataset %s, not on files: leave out --data: %w", name, c.Data.Served[:16], errUsage)
		}
		return c, nil
	}
	if dataFile == "" {
		return nil, fmt.Errorf("job %q trains on files each machine holds; give --data <data config> saying where they are on this one: %w", name, errUsage)
	}
	d, err := data.LoadConfig(dataFile)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if !sameData(dataSpec{Transforms: d.Transforms, Classes: d.Classes, Text: d.Text != nil, Targets: d.Targets}, c.Data) {
		return nil, fmt.Errorf("--data %s has other transforms, classes or targets than job %q: this machine's data config must differ from the first peer's in its paths alone: %w", dataFile, name, errUsage)
	}
	c.data = d
	return c, nil
}

// sameData reports whether two data specs are one.
func sameData(a, b dataSpec) bool {
	ja, erra := json.Marshal(a)
	jb, errb := json.Marshal(b)
	return erra == nil && errb == nil && bytes.Equal(ja, jb)
}

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

// handedOut is the config as peers hand it to those that join with --job:
// the job's spec in its canonical form, whose SHA-256 is the job's hash.
func (c *jobConfig) handedOut() ([]byte, error) { return c.encode() }

// encode is the spec's canonical JSON.
func (s *jobSpec) encode() ([]byte, error) { return json.Marshal(s) }

// resolve checks a job file and splits it into the job's spec and this
// machine's settings.
func (f *jobFile) resolve(dir string) (*jobConfig, error) {
	switch {
	case f.WorldSize == 0 && f.Nodes == 0:
		return nil, errors.New(`no world size; add "world_size": <number of peers> (or "nodes")`)
	case f.WorldSize != 0 && f.Nodes != 0 && f.WorldSize != f.Nodes:
		return nil, fmt.Errorf("world_size %d and nodes %d disagree; give one", f.WorldSize, f.Nodes)
	case f.WorldSize == 0:
		f.WorldSize = f.Nodes
	}
	if f.Rank != nil && f.Nr != nil && *f.Rank != *f.Nr {
		return nil, fmt.Errorf("rank %d and nr %d disagree; give one", *f.Rank, *f.Nr)
	}
	c := &jobConfig{localSettings: f.localSettings, jobSpec: jobSpec{Name: f.Name, WorldSize: f.WorldSize, MinWorldSize: f.MinWorldSize, MaxWorldSize: f.MaxWorldSize,
		Epochs: f.Epochs, BatchSize: f.BatchSize, Seed: f.Seed, Model: f.Model, Loss: f.Loss, Optimizer: f.Optimizer,
		GradNormGuard: f.GradNormGuard, EvalEvery: f.EvalEvery, Compression: f.Compression, RingOrder: f.RingOrder, Sync: f.Sync, Pipeline: f.Pipeline, BucketBytes: defaultBucketMB << 20,
		UpdateChecks: f.UpdateChecks, NonIIDShards: f.NonIIDShards}}
	if f.BucketMB != nil {
		if mb := *f.BucketMB; !(mb >= 0 && mb <= maxBucketMB) {
			return nil, fmt.Errorf("bucket_mb %g; want 0 (one allreduce after backward) up to %d", mb, maxBucketMB)
		}
		c.BucketBytes = int(*f.BucketMB * (1 << 20))
	}
	if err := c.localSettings.check(dir); err != nil {
		return nil, err
	}
	if len(f.Data) == 0 {
		return nil, errors.New(`no data config; add "data": {"transforms": [...], "dataset_path": {...}}, "data": "<file>" or "data": {"served": "<dataset ID>"}`)
	}
	if bytes.Contains(f.Data, []byte(`"served"`)) {
		var served struct {
			Served string `json:"served"`
		}
		if err := decodeStrict(f.Data, &served); err != nil {
			return nil, fmt.Errorf(`data: %w; a served dataset is named by its ID alone, {"served": "<ID>"}: its transforms and classes come with it`, err)
		}
		c.Data.Served = served.Served
	} else {
		var err error
		var dataPath string
		if json.Unmarshal(f.Data, &dataPath) == nil {
			if !filepath.IsAbs(dataPath) {
				dataPath = filepath.Join(dir, dataPath)
			}
			c.data, err = data.LoadConfig(dataPath)
		} else {
			c.data, err = data.ParseConfig(bytes.NewReader(f.Data), dir)
		}
		if err != nil {
			return nil, err
		}
		c.Data.Transforms, c.Data.Classes, c.Data.Text, c.Data.Targets = c.data.Transforms, c.data.Classes, c.data.Text != nil, c.data.Targets
	}
	if err := c.resolveSpec(); err != nil {
		return nil, err
	}
	return c, nil
}

// maxBucketMB bounds bucket_mb.
const maxBucketMB = 1024

// check fills this machine's settings' defaults and says what is wrong
// with them; a relative cache_dir is taken from dir.
func (l *localSettings) check(dir string) error {
	if l.GPUs < 0 {
		return fmt.Errorf("gpus %d; want 0 (CPU) or 1 (one GPU per peer)", l.GPUs)
	}
	if l.CheckpointEvery < 0 {
		return fmt.Errorf("checkpoint_every %d; want 0 (after every epoch only) or a number of steps", l.CheckpointEvery)
	}
	if l.JoinTimeout < 0 || l.StepTimeout < 0 || l.AdmissionTimeout < 0 {
		return fmt.Errorf("join_timeout %v, step_timeout %v, admission_timeout %v; want positive durations",
			time.Duration(l.JoinTimeout), time.Duration(l.StepTimeout), time.Duration(l.AdmissionTimeout))
	}
	if l.AdmissionTimeout == 0 {
		l.AdmissionTimeout = duration(10 * time.Second)
	}
	if l.JoinTimeout == 0 {
		l.JoinTimeout = duration(60 * time.Second)
	}
	if l.StepTimeout == 0 {
		l.StepTimeout = duration(60 * time.Second)
	}
	if err := l.Limits.check(); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if l.RequestSize < 0 || l.RequestSize > maxRequestSize {
		return fmt.Errorf("request_size %d; want 1 to %d samples (0: 256)", l.RequestSize, maxRequestSize)
	}
	if l.RequestSize == 0 {
		l.RequestSize = 256
	}
	if l.CacheDir != "" && !filepath.IsAbs(l.CacheDir) && dir != "" {
		l.CacheDir = filepath.Join(dir, l.CacheDir)
	}
	return nil
}

// resolveSpec checks the job's spec, writes its defaults out, and hashes
// it. It is the same check for a job file and for a config a peer handed
// out, and a spec that passed it passes again unchanged.
func (c *jobConfig) resolveSpec() error {
	if c.Name == "" {
		return errors.New(`no job name; add "name": "<job>" (peers with the same name find each other)`)
	}
	if c.WorldSize < 1 || c.WorldSize > maxWorldSize {
		return fmt.Errorf("world_size %d; want 1 to %d", c.WorldSize, maxWorldSize)
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
	if err := c.resolveLoss(); err != nil {
		return err
	}
	if err := c.resolveOptimizer(); err != nil {
		return err
	}
	if err := c.resolveSizes(); err != nil {
		return err
	}
	wire, err := ring.ParseEncoding(c.Compression)
	if err != nil {
		return fmt.Errorf("compression: %w", err)
	}
	c.wire, c.Compression = wire, ""
	if wire != ring.F32 {
		c.Compression = wire.String()
	}
	if c.order, err = p2p.ParseRingOrder(c.RingOrder); err != nil {
		return fmt.Errorf("ring_order: %w", err)
	}
	c.RingOrder = ""
	if c.order != p2p.OrderMeasured {
		c.RingOrder = c.order.String()
	}
	if c.Sync != nil {
		if err := c.Sync.check(); err != nil {
			return err
		}
		if err := c.Sync.localSGD(c.optimizer(nil), c.MinWorldSize).Check(wire, c.GradNormGuard); err != nil {
			return fmt.Errorf("sync (with compression %q, grad_norm_guard %v): %w", c.Compression, c.GradNormGuard, err)
		}
	}
	if c.Pipeline != nil {
		if err := c.checkPipeline(); err != nil {
			return err
		}
	}
	if err := c.checkUpdates(wire); err != nil {
		return err
	}
	if c.NonIIDShards < 0 || c.NonIIDShards > 1024 || c.NonIIDShards > 0 && c.Pipeline != nil {
		return fmt.Errorf("non_iid_shards %d; want 0 (shuffled) to 1024, and no pipeline", c.NonIIDShards)
	}
	if c.BucketBytes < 0 || c.BucketBytes > maxBucketMB<<20 {
		return fmt.Errorf("bucket of %d bytes; want 0 (one allreduce after backward) up to %d MB", c.BucketBytes, maxBucketMB)
	}
	if c.EvalEvery < 0 {
		return fmt.Errorf("eval_every %d; want 0 (after every epoch only) or a number of steps", c.EvalEvery)
	}
	if c.GradNormGuard != 0 && !(c.GradNormGuard > 1) {
		return fmt.Errorf("grad_norm_guard %g; want 0 (off) or a factor over 1", c.GradNormGuard)
	}
	if err := c.checkData(); err != nil {
		return err
	}
	b, err := c.encode()
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	c.hash = hex.EncodeToString(sum[:])
	return nil
}

// resolveOptimizer checks the optimizer and its schedule; none is SGD at
// 0.05 with momentum 0.9.
func (c *jobConfig) resolveOptimizer() error {
	switch c.Optimizer.Name {
	case "":
		c.Optimizer.Name, c.Optimizer.LR, c.Optimizer.Momentum = "sgd", 0.05, 0.9
	case "sgd", "adam", "adamw":
		if !(c.Optimizer.LR > 0) {
			return fmt.Errorf("optimizer %s has lr %v; want a positive learning rate", c.Optimizer.Name, c.Optimizer.LR)
		}
	default:
		return fmt.Errorf("optimizer %q is unknown; want sgd, adam or adamw", c.Optimizer.Name)
	}
	o := c.Optimizer
	switch {
	case o.Betas != nil && (o.Name == "sgd" || len(o.Betas) != 2 || !(o.Betas[0] >= 0 && o.Betas[0] < 1 && o.Betas[1] >= 0 && o.Betas[1] < 1)):
		return fmt.Errorf("optimizer %s with betas %v; want two in [0, 1), for adam or adamw", o.Name, o.Betas)
	case o.Eps < 0 || o.Eps != 0 && o.Name == "sgd":
		return fmt.Errorf("optimizer %s with eps %v; want a positive eps, for adam or adamw", o.Name, o.Eps)
	case !(o.ClipGradNorm >= 0) || math.IsInf(o.ClipGradNorm, 0):
		return fmt.Errorf("clip_grad_norm %v; want 0 (off) or a positive norm", o.ClipGradNorm)
	case o.MinLR < 0 || o.MinLR > o.LR:
		return fmt.Errorf("min_lr %v; want from 0 to lr %v", o.MinLR, o.LR)
	}
	return c.schedule().Validate()
}

// resolveSizes checks min_world_size and max_world_size against
// world_size; left out, each is world_size.
func (c *jobConfig) resolveSizes() error {
	if c.MinWorldSize == 0 {
		c.MinWorldSize = c.WorldSize
	}
	if c.MinWorldSize < 1 || c.MinWorldSize > c.WorldSize {
		return fmt.Errorf("min_world_size %d; want between 1 and world_size %d", c.MinWorldSize, c.WorldSize)
	}
	if c.MaxWorldSize == 0 {
		c.MaxWorldSize = c.WorldSize
	}
	if c.MaxWorldSize < c.WorldSize || c.MaxWorldSize > maxWorldSize {
		return fmt.Errorf("max_world_size %d; want between world_size %d and %d", c.MaxWorldSize, c.WorldSize, maxWorldSize)
	}
	return nil
}

// checkData checks the data section: a served dataset's ID, or local
// transforms.
func (c *jobConfig) checkData() error {
	if c.Data.Served != "" {
		if c.Data.Transforms != nil || c.Data.Classes != nil || c.Data.Targets != nil {
			return errors.New(`data: a served dataset is named by its ID alone, {"served": "<ID>"}: its transforms and classes come with it`)
		}
		if _, err := data.ParseID(c.Data.Served); err != nil {
			return fmt.Errorf("data: served: %w", err)
		}
	} else if c.Data.Text {
		if c.Data.Transforms != nil || c.Data.Classes != nil {
			return errors.New("data: a text corpus takes no transforms or classes")
		}
	} else if c.Data.Targets == nil { // a table's config is checked as it is read: no transforms
		if _, err := data.NewPipeline(c.Data.Transforms); err != nil {
			return fmt.Errorf("data: %w", err)
		}
	}
	return nil
}

// checkPipeline checks the pipeline section against the rest of the job
// and writes its defaults out. Its layer counts hold for any data shape.
func (c *jobConfig) checkPipeline() error {
	p := c.Pipeline
	if p.Schedule == "" {
		p.Schedule = pipeline.OneFOneB
	}
	if p.Boundary == "" {
		p.Boundary = "f32"
	}
	layers := 0
	if c.spec != nil {
		layers = len(c.spec.Layers)
	} else if s, err := train.BuiltinSpec(c.modelName, 1, 28, 28, 10); err == nil {
		layers = len(s.Layers)
	}
	if err := p.CheckLayers(layers, c.BatchSize); err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	switch {
	case c.WorldSize%p.Stages != 0:
		return fmt.Errorf("pipeline: world_size %d is not a multiple of stages %d (each stage is held by world_size / stages peers)", c.WorldSize, p.Stages)
	case c.MinWorldSize != c.WorldSize || c.MaxWorldSize != c.WorldSize:
		return fmt.Errorf("pipeline: min_world_size %d and max_world_size %d; a pipeline job carries on while every stage has a peer, waits for one to take a stage left empty, and grows no larger than world_size: leave both out (or give world_size %d)", c.MinWorldSize, c.MaxWorldSize, c.WorldSize)
	case c.Sync != nil:
		return errors.New("pipeline: sync (DiLoCo) and pipeline stages do not go together")
	}
	return nil
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
	if m.ID() != c.Data.Served {
		return fmt.Errorf("served dataset %s is not the %s the job config names", m.ID()[:16], c.Data.Served[:16])
	}
	c.data = m.Config()
	return nil
}

// fitsModel checks, from a served dataset's manifest alone, that its
// samples fit the job's model: a dataset that does not is refused before
// a byte of it is fetched or memory is taken for it.
func (c *jobConfig) fitsModel(m *data.Manifest) error {
	if m.Text != (c.context() > 0) {
		return fmt.Errorf("served dataset %s is text: %v; the model a language model: %v — want both or neither", m.ID()[:16], m.Text, c.context() > 0)
	}
	if m.Text {
		return nil // windows of the model's context, made as it is fetched
	}
	ch, h, w, err := m.Shape("train")
	if err != nil {
		return err
	}
	if _, err := c.modelSpec(ch, h, w, len(m.Classes)); err != nil {
		return fmt.Errorf("served dataset %s: its samples become %d×%d×%d: %w", m.ID()[:16], ch, h, w, err)
	}
	return nil
}

// checkUpdates checks "update_checks", and says why its audits could not
// run, where they are asked for: every peer rebuilds another's batch and
// recomputes its gradients, which a served dataset (a peer holds its own
// share), int8's error feedback (a remainder only its peer holds) and
// dropout (masks drawn from its peer's stream) rule out.
func (c *jobConfig) checkUpdates(wire ring.Encoding) error {
	if err := c.UpdateChecks.check(c.Sync != nil || c.Pipeline != nil); err != nil {
		return err
	}
	if c.UpdateChecks == nil || c.UpdateChecks.AuditEvery <= 0 {
		return nil
	}
	why := ""
	switch {
	case wire == ring.I8:
		why = `compression "int8": its error feedback adds a remainder only the sender holds`
	case c.Data.Served != "":
		why = "a served dataset: each peer holds only its own share of it"
	case c.spec != nil && slices.ContainsFunc(c.spec.Layers, func(l train.Layer) bool { return l.Type == train.LayerDropout }):
		why = "dropout: a peer's masks are drawn from its own stream"
	}
	if why != "" {
		return fmt.Errorf("update_checks: audit_every %d: audits recompute a peer's gradients on its batch, which %s; set audit_every 0",
			c.UpdateChecks.AuditEvery, why)
	}
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
	var keys map[string]json.RawMessage
	if json.Unmarshal(c.Model, &keys) == nil && keys["gpt"] != nil {
		var preset struct {
			GPT gptPreset `json:"gpt"`
		}
		dec := json.NewDecoder(bytes.NewReader(c.Model))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&preset); err != nil {
			return fmt.Errorf(`model gpt: %w; want {"gpt": {"layers": 4, "dim": 128, "heads": 4, "context": 128}}`, err)
		}
		s, err := preset.GPT.spec()
		if err != nil {
			return err
		}
		c.spec = &s
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

// gptPreset is the model {"gpt": {...}}: a byte-level GPT
// (train.GPTSpec), torch_gpt.py's at its defaults.
type gptPreset struct {
	Layers  int `json:"layers"`
	Dim     int `json:"dim"`
	Heads   int `json:"heads"`
	Context int `json:"context"`
}

// maxContext bounds a GPT's context: its attention keeps T×T values a
// head and sample.
const maxContext = 4096

func (g *gptPreset) spec() (train.Spec, error) {
	switch {
	case g.Layers < 1 || g.Dim < 1 || g.Heads < 1 || g.Context < 1:
		return train.Spec{}, fmt.Errorf("model gpt with %d layers, dim %d, %d heads, context %d; want every one at least 1", g.Layers, g.Dim, g.Heads, g.Context)
	case g.Dim%g.Heads != 0:
		return train.Spec{}, fmt.Errorf("model gpt: %d heads do not divide dim %d", g.Heads, g.Dim)
	case g.Context > maxContext:
		return train.Spec{}, fmt.Errorf("model gpt: context %d; at most %d", g.Context, maxContext)
	}
	s := train.GPTSpec(g.Layers, g.Dim, g.Heads, g.Context)
	if _, err := s.Shapes(); err != nil {
		return s, fmt.Errorf("model gpt: %w", err)
	}
	return s, nil
}

// context is the bytes a sample of the model reads, for a language model
// (one whose first layer is an embedding), or 0.
func (c *jobConfig) context() int {
	if c.spec == nil || len(c.spec.Layers) == 0 || c.spec.Layers[0].Type != train.LayerEmbedding || len(c.spec.Input) != 1 {
		return 0
	}
	return c.spec.Input[0]
}

// textContext makes a text split's samples the model's windows; a text
// corpus wants a language model, and a language model text.
func (c *jobConfig) textContext(splits ...*data.Split) error {
	for _, s := range splits {
		switch {
		case s == nil:
		case s.Text == nil && c.context() > 0:
			return fmt.Errorf("a language model (its first layer an embedding) trains on text: name a corpus with \"data\": {\"text\": {\"folder\": ...}}")
		case s.Text != nil && c.context() == 0:
			return fmt.Errorf("data is text, %s: the model must be a language model, {\"gpt\": {...}} or a layer list that begins with an embedding", s.Source)
		case s.Text != nil:
			if err := s.SetContext(c.context()); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveLoss checks the loss against the model and the data, and writes
// it in its canonical form: left out for cross-entropy.
func (c *jobConfig) resolveLoss() error {
	if c.spec != nil && c.spec.Loss != "" {
		if c.Loss != "" && c.Loss != string(c.spec.Loss) {
			return fmt.Errorf("loss %q, and the model spec's %q: name it once, at the top of the job", c.Loss, c.spec.Loss)
		}
		c.Loss = string(c.spec.Loss)
	}
	switch train.Loss(c.Loss) {
	case "cross_entropy":
		c.Loss = ""
	case train.CrossEntropy, train.MSE, train.BCE:
	default:
		return fmt.Errorf("loss %q; want cross_entropy (the default), mse or bce", c.Loss)
	}
	if c.spec != nil {
		c.spec.Loss = train.Loss(c.Loss)
	}
	switch targets := c.Data.Targets != nil; {
	case targets && c.Loss == "":
		return fmt.Errorf(`data: target columns %q are float values: set "loss": "mse" (or "bce" for values in [0, 1]) for them`, c.Data.Targets)
	case !targets && c.Loss != "":
		return fmt.Errorf(`loss %s compares the model's outputs with float targets: give a CSV table and name its target columns in the data config, "targets": ["y"]`, c.Loss)
	}
	return nil
}

// modelSpec is the model for samples of C×H×W and the given classes (or
// a table's targets); a
// spec without an input takes the data's shape, and it is checked here, with
// errors naming the layer.
func (c *jobConfig) modelSpec(ch, h, w, classes int) (train.Spec, error) {
	if c.spec == nil {
		s, err := train.BuiltinSpec(c.modelName, ch, h, w, classes)
		s.Loss = train.Loss(c.Loss)
		return s, err
	}
	s := *c.spec
	if len(s.Input) == 0 {
		s.Input = []int{ch, h, w}
		if len(s.Layers) > 0 && s.Layers[0].Type == train.LayerLinear {
			s.Input = []int{ch * h * w}
		}
	} else if n := product(s.Input); n != ch*h*w {
		return s, fmt.Errorf("model spec: input %v is %d values a sample, but the data's samples become %d×%d×%d", s.Input, n, ch, h, w)
	}
	if _, err := s.Shapes(); err != nil {
		return s, fmt.Errorf("model spec: %w", err)
	}
	if k := s.Targets(); k > 0 && k != classes {
		return s, fmt.Errorf("model spec: the last layer gives %d outputs; the data has %d target columns %q: want one output a target", k, classes, c.Data.Targets)
	}
	return s, nil
}

// outputsOf is what a split's samples want the model to give: a score
// per class, or a value per target column.
func outputsOf(s *data.Split) int {
	if s.Table != nil {
		return s.Table.Targets
	}
	return len(s.Classes)
}

// product multiplies dims, saturating rather than overflowing.
func product(dims []int) int {
	n := 1
	for _, d := range dims {
		if d <= 0 || n > math.MaxInt32/d {
			return -1
		}
		n *= d
	}
	return n
}

// overrideModel replaces the config's model with a built-in one, as
// --model asks; every peer must be given the same.
func (c *jobConfig) overrideModel(name string) error {
	b, err := json.Marshal(name)
	if err != nil {
		return err
	}
	c.Model, c.spec = b, nil
	return c.resolveSpec()
}

// schedule is the optimizer's learning-rate schedule over the job's epochs.
func (c *jobConfig) schedule() train.Schedule {
	o := c.Optimizer
	return train.Schedule{Kind: o.Schedule, Base: o.LR, Epochs: c.Epochs, StepSize: o.StepSize, Gamma: o.Gamma,
		MinLR: o.MinLR, WarmupSteps: o.WarmupSteps, TotalSteps: o.TotalSteps}
}

// jobOfConfig is the job a job config's peers know, as p2p has it: what
// `bench flood-peer` lies to.
func jobOfConfig(path string) (p2p.Job, error) {
	cfg, err := loadJobConfig(path)
	if err != nil {
		return p2p.Job{}, err
	}
	return cfg.p2pJob(), nil
}
