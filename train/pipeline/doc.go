// Package pipeline splits a model's layer list into stages held by
// different peers — model parallelism on top of data parallelism. Stage s
// of S runs layers [Lo, Hi) of the spec (a train.Stage); it receives the
// activations of each micro-batch from stage s−1 and sends its own to
// stage s+1, and sends the gradients of its inputs back. An output a
// layer saves for a later stage (a residual) is carried across every
// boundary in between, and its gradient back.
//
// A step cuts the batch into M micro-batches and runs them by a schedule
// (Schedule): GPipe (all forwards, then all backwards) or 1F1B (after a
// warm-up, one forward then one backward, so stage s holds at most S−s
// micro-batches' inputs). Backward recomputes its stage's forward pass
// from the stage's input, so a micro-batch in flight costs a stage only
// its input. Parameter gradients add up over the micro-batches in their
// order, which makes a split model train to the bits one peer running
// the whole model with the same gradient accumulation reaches.
//
// A Pipe is one peer's stage as a train.Model: a train.Replica around it
// averages the stage's gradients over the ring of the peers that hold the
// same stage (data parallel inside a stage), and train.Run drives it like
// any model. What crosses a boundary is a Frame, checked against the
// generation, stage, step, micro-batch and shapes the receiver expects
// before it is used.
package pipeline
