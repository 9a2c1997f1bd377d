// Package train computes gradients and keeps replicas in step: after every
// backward pass a Replica averages its gradients over a Collective (a ring)
// and then applies its optimizer, so every replica applies the same bits.
// On a ring of one there is nothing to average: the gradients are checked
// and applied where the model keeps them.
//
// Models are built from a Spec (BuiltinSpec's mlp and cnn, or a layer list
// with residual connections and dropout) by NewModel: a gorgonia graph
// that gorgonia differentiates, run op by op on the caller's goroutine by
// a tape of this package (tape.go; gorgonia's TapeMachine hands each run
// to another thread). Its linear, conv2d, ReLU and max-pool layers are ops
// of this package (linear.go, conv.go, relu.go, pool.go)
// that multiply with train/gemm and keep their outputs from step to step;
// gorgonia's own products use train/gemm too once the program calls
// InstallBLAS (gorgonia's BLAS is the process's). The CUDA and Host
// engines of train/engine satisfy the same Model interface.
//
// Language models are layer lists too (GPTSpec is torch_gpt.py's model):
// an embedding of bytes and their positions, layernorm, causal multi-head
// attention and GELU as kernels of this package (seq.go, through
// kernelop.go), each row's next-byte cross-entropy fused into one kernel.
// A Spec's Loss is cross-entropy over class scores by default, or MSE or
// BCE against float targets that each row of x carries after its features
// (targetloss.go): a short batch's padding adds nothing to any of them.
//
// Around the model: SGD, Adam and AdamW on plain slices (their state is ours, for
// checkpoints; the loops are train/vec's), schedules, the distributed step
// with a non-finite check that skips the step on every rank and leave
// requests riding in the same allreduce (the gradients sent whole or in
// buckets that go round while backward still computes — Layered models,
// the engine's — and narrowed to bf16, fp16 or int8 with error feedback;
// with Sketch, each rank's count sketch in the trailer checks the sum and
// names a rank whose gradients stand far apart, and audits — every rank
// recomputing a rank's gradients on its batch, at a step drawn after the
// exchange or where its sketches point against the others', repeat or
// pass the norm guard's bound — name one that did not compute what it
// sent, audits.go),
// DiLoCo's local steps with an outer step every few (LocalSGD; its
// pseudo-gradients whole, or sparse and low-bit with error feedback, coded
// by train/sparse and gathered from every rank in one ring allgather, then
// averaged or, with Robust, aggregated by CenteredClip, a rank whose
// update stands apart round after round, or comes again, named as a
// liar). How a step syncs is a
// Sync chosen once, when the replica is made, a file per mode: every step
// (everystep.go), DiLoCo rounds (rounds.go), the outer sync streamed in
// fragments, each exchange beside inner steps (stream.go), or rounds that
// close by a deadline without a rank slow to compute, whose work goes
// into the next round (quorum.go); Replica.Step is the same for all, and
// LocalSGD.Check states what each mode takes. Rank 0's
// parameters broadcast at
// start, a parameter-hash comparison across ranks (with the straggler
// report), sharded
// evaluation, checkpoints and resume, and Run, the epoch loop. Run never
// changes its ring: when the ring fails or must change (a peer lost or
// leaving, liars caught, a newcomer waiting) it returns an *Interrupted
// with the position it reached, and the elastic job around all of it —
// train/elastic's — changes the ring, brings the replicas level
// (Replica.Level, Replica.Admitted: every rank at the newest step a donor,
// each sending a hash-checked part of the state, over the ring or straight
// to the ranks that take it, Replica.Direct) and runs again from there. Control
// data between the ranks (claims, hashes, peer lists) are typed messages
// with one codec (control.go). A Replica's Tracer is told each phase of
// every step (data, forward, backward, each allreduce, the optimizer): the
// timeline train/trace writes.
//
// A Stage is layers [lo, hi) of a spec as a graph of their own, whose
// inputs are the activation entering it and the saved outputs of earlier
// layers it uses: the unit train/pipeline splits a model into.
//
// # Usage
//
//	train.InstallBLAS() // once, in main
//	spec, err := train.BuiltinSpec("mlp", 1, 28, 28, 10)
//	m, err := train.NewModel(train.ModelConfig{Spec: spec, Batch: 64, Seed: seed})
//	rep := train.NewReplica(m, &train.SGD{LR: 0.05, Momentum: 0.9}, r) // r: a *ring.Ring
//	err = rep.SyncParams(ctx)
//	loss, err := rep.Step(ctx, batch.X, batch.Y, batch.N)
package train
