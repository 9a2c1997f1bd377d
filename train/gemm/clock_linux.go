package gemm

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadClock returns the CPU time the calling OS thread (the goroutine
// locked to it) has used since the call: what a trial takes, not what it
// waited for a core. Where the thread's clock cannot be read, the
// clock's time.
func threadClock() func() time.Duration {
	read := func() (time.Duration, bool) {
		var ts unix.Timespec
		err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
		return time.Duration(ts.Nano()), err == nil
	}
	t0, ok := read()
	if !ok {
		return wallClock()
	}
	return func() time.Duration {
		t, _ := read()
		return t - t0
	}
}
