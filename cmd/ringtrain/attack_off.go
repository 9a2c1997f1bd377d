//go:build !ringtrain_attack

package main

import "github.com/ringtrain/ringtrain/train"

// attacker does nothing in the default build: only a build tagged
// ringtrain_attack can make a peer lie (attack_on.go).
func attacker(*train.Replica, *train.LocalSGD) {}
