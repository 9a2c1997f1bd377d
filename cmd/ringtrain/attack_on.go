//go:build ringtrain_attack

package main

import (
	"fmt"
	"os"

	"github.com/ringtrain/ringtrain/train"
)

// attacker, in builds tagged ringtrain_attack (tests and benches of
// robust aggregation and update checks), makes this peer send its
// updates — o's pseudo-gradients where the job syncs by DiLoCo rounds,
// else its gradients every step — altered as RINGTRAIN_ATTACK says:
// scale, flip, noise or replay (train's attack).
func attacker(rep *train.Replica, o *train.LocalSGD) {
	kind := os.Getenv("RINGTRAIN_ATTACK")
	if kind == "" {
		return
	}
	if err := rep.Attack(o, kind, 1); err != nil {
		fmt.Fprintln(os.Stderr, "ringtrain (attacker build):", err)
		os.Exit(2)
	}
	fmt.Fprintln(os.Stderr, "ringtrain (attacker build): this peer sends its updates altered:", kind)
}
