// Package train computes gradients with gorgonia and keeps replicas in step:
// after every backward pass a Replica averages its gradients over a
// Collective (a ring) and then applies its optimizer, so every replica
// applies the same bits.
//
// Built so far (issue 7 is open): a fully connected ReLU network (NewMLP),
// SGD with momentum and weight decay and Adam on plain slices (their state
// is ours, for checkpoints), the distributed step with a non-finite
// gradient check that skips the step on every rank, rank 0's parameters
// broadcast at start, a parameter-hash comparison across ranks, and
// Evaluate (loss, accuracy, per class). Still to come: the CNN and
// layer-list specs, schedules, a forward-only evaluation path, checkpoints
// and the epoch loop.
//
// # Usage
//
//	m, err := train.NewMLP(train.MLPConfig{Inputs: 784, Hidden: []int{256, 128}, Classes: 10, Batch: 64, Seed: seed})
//	rep := train.NewReplica(m, &train.SGD{LR: 0.05, Momentum: 0.9}, r) // r: a *ring.Ring
//	err = rep.SyncParams(ctx)
//	loss, err := rep.Step(ctx, batch.X, batch.Y, batch.N)
package train
