//go:build ringtrain_attack

package main

import (
	"fmt"
	"os"

	"github.com/ringtrain/ringtrain/train"
)

// attacker, in builds tagged ringtrain_attack (tests and benches of robust
// aggregation), makes this peer send its pseudo-gradients altered as
// RINGTRAIN_ATTACK says: scale, flip, noise or replay (train's attack).
func attacker(o *train.LocalSGD) {
	kind := os.Getenv("RINGTRAIN_ATTACK")
	if kind == "" {
		return
	}
	if err := o.Attack(kind, 1); err != nil {
		fmt.Fprintln(os.Stderr, "ringtrain (attacker build):", err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "ringtrain (attacker build): this peer sends its pseudo-gradients altered:", kind)
}
