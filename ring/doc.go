// Package ring implements the collectives of one ring generation —
// AllreduceSum, AllreduceMean (also with bf16, fp16 or blockwise int8 on
// the wire: AllreduceMeanAs), Allgather (each rank's segment to every
// rank, bit for bit, in n − 1 steps), Broadcast and Barrier — over a Transport that
// carries bytes to the successor and from the predecessor. AwaitIncoming
// says when the predecessor has begun the next collective, for a rank
// that decides what to send once another rank has started (train's outer
// rounds with a deadline). Order solves a ring's order from its members'
// measures of their links: the slowest link as fast as it can be, then the
// least time, the same order from the same measures on any CPU.
//
// It knows nothing of libp2p or of training: a Transport is two byte streams,
// and the package frames, checks and pipelines what goes over them. MemRing
// and LoopbackTCP build rings in one process for tests and benchmarks;
// ConnectTCP builds one rank's plain TCP links; package p2p provides links
// over libp2p streams.
//
// # Usage
//
//	r, err := ring.New(transport, ring.Config{Rank: rank, Size: n, Generation: gen})
//	if err != nil { ... }
//	defer r.Close()
//	if err := r.AllreduceMean(ctx, grads); err != nil { ... } // grads now hold the mean on every rank
//
// # Wire
//
// Every frame is a 56-byte header (see Header) followed by its payload of
// float32, bfloat16 or half values, or int8 blocks (a float32 scale, then
// a byte per value), as the header's encoding says, little-endian. A
// receiver knows exactly which frame must come
// next, checks every header field against it before reading the payload, and
// reads the payload into memory it sized itself.
//
// # Failure
//
// Cancelling a call's context, or a neighbour that goes away, fails the call
// on every rank: the failing rank closes its links, which fails its
// neighbours' calls in turn. A Ring that has failed stays closed; the way on
// is a new generation.
package ring
