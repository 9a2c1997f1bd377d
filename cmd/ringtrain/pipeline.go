package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/elastic"
)

// runPipeline runs a job whose model is cut into stages
// (elastic.PipelineJob): which stage this peer builds is known once the
// ring has formed.
func runPipeline(ctx context.Context, cfg *jobConfig, device string, trainSplit, testSplit *data.Split, members elastic.StageNet,
	stdout, status io.Writer, tracer train.Tracer, obs *observer, log zerolog.Logger) error {
	if device != "" && device != "cpu" {
		return fmt.Errorf("device %s: a pipeline stage computes on the CPU engine only: %w", device, errUsage)
	}
	layers, err := cfg.modelSpec(trainSplit.C, trainSplit.H, trainSplit.W, outputsOf(trainSplit))
	if err != nil {
		return err
	}
	spec := train.ModelConfig{Spec: layers, Batch: cfg.BatchSize, Seed: cfg.Seed}
	if err := cfg.Pipeline.Check(layers, cfg.BatchSize); err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	job := &elastic.PipelineJob{Members: members, Pipeline: *cfg.Pipeline, Model: spec, StepTimeout: time.Duration(cfg.StepTimeout), WorldSize: cfg.WorldSize,
		Logger: log, Out: stdout,
		NewReplica: func(m train.Model) (*train.Replica, error) {
			rep := cfg.replica(m, cfg.optimizer(m.ParamNames()))
			rep.Trace = tracer
			return rep, nil
		}}
	job.Training = cfg.runConfig(trainSplit, testSplit)
	job.Training.Progress, job.Training.ProgressEvery = cfg.progress(testSplit != nil, status, func() *zerolog.Logger { return &log })
	if obs != nil {
		job.Dropped, job.Training.Progress = obs.dropped, obs.around(job.Training.Progress)
	}
	if cfg.CheckpointDir != "" {
		job.Checkpoint = filepath.Join(cfg.CheckpointDir, cfg.Name+".ckpt")
		job.CheckpointBase = cfg.checkpointBase(spec, trainSplit)
	}
	sum, err := job.Run(ctx)
	if errors.Is(err, elastic.ErrLeft) {
		// A peer Ctrl-C'd whose stage has other peers leaves; the stages
		// train on without it.
		fmt.Fprintf(stdout, "left the job (stage %d); the others carry on\n", sum.Stage)
		return nil
	}
	if errors.Is(err, p2p.ErrJobEnded) {
		fmt.Fprintln(stdout, "the job ended while this peer waited to be admitted: nothing left to train")
		log.Info().Err(err).Msg("the job ended before this standby was admitted")
		return nil
	}
	if err != nil {
		return err
	}
	if sum.Replica < 0 {
		// A spare at the end: its stage's state is the others'.
		fmt.Fprintf(stdout, "stage %d of %d: a spare at the end (its stage trained with %d replicas)\n", sum.Stage, sum.Stages, sum.Replicas)
		log.Info().Int("stage", sum.Stage).Int("stages", sum.Stages).Int("replicas", sum.Replicas).Int("reformations", sum.Reforms).Msg("summary: a spare at the end")
		return nil
	}
	if job.Checkpoint != "" && sum.Stage == 0 && sum.Replica == 0 {
		fmt.Fprintf(stdout, "checkpoint: %s (the whole model, gathered from the stages)\n", job.Checkpoint)
	}
	fmt.Fprintf(stdout, "stage %d of %d, replica %d of %d: %s, stage param hash %s\n",
		sum.Stage, sum.Stages, sum.Replica, sum.Replicas, cfg.testFigure(sum.TestAccuracy, sum.TestLoss), sum.ParamHash[:16])
	ev := log.Info()
	if cfg.context() > 0 { // a language model's validation loss in bits per byte too
		ev = ev.Float64("test_bits_per_byte", sum.TestLoss/math.Ln2)
	}
	ev.Int("stage", sum.Stage).Int("stages", sum.Stages).Int("replica", sum.Replica).Int("replicas", sum.Replicas).
		Ints("split", sum.Split).Int("epochs", sum.Epochs).Float64("test_accuracy", sum.TestAccuracy).Int("test_samples", sum.TestSamples).
		Float64("test_loss", sum.TestLoss).Str("param_hash", sum.ParamHash).Float64("samples_per_sec", sum.SamplesPerSec).
		Int("peak_micro_batches", sum.Pipe.PeakInFlight).Int64("peak_input_bytes", sum.Pipe.PeakBytes).Int("reformations", sum.Reforms).Msg("summary")
	return nil
}
