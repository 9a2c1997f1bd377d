// Package bench is ringtrain's `bench` subcommands: the ring's allreduce
// against the pattern ceiling (in one process, as processes, or as peers
// across network namespaces), ring formation through the DHT, the
// engines held against each other, one device's training speed, the CPU
// step's kernels, served data, pipeline stages, and a job under a
// hostile peer's flood. Each is a command function the ringtrain command
// wires into its table; their figures are what the READMEs' results
// quote.
package bench
