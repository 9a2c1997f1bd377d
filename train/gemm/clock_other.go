//go:build !linux

package gemm

import "time"

// threadClock is the clock's time since the call where a thread's CPU
// time is not read: a trial then counts what it waited for a core too.
func threadClock() func() time.Duration { return wallClock() }
