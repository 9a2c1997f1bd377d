//go:build ringtrain_attack

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// startAs is a peer run by this test binary (built with the attacker
// tag), with env added to its environment.
func startAs(t *testing.T, env []string, args ...string) *started {
	t.Helper()
	skipShort(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(context.Background(), self, args...)
	cmd.Env = append(append(os.Environ(), "RINGTRAIN_TEST_AS_MAIN=1"), env...)
	return startCmd(t, cmd)
}

// firstPeer starts peer 0 of a job of config cfg (identities in dir) and
// returns a way to start peer i with env added, peer 0 and its address.
func firstPeer(t *testing.T, dir, cfg string) (join func(i int, env []string, boot ...string) *started, first *started, boot string) {
	join = func(i int, env []string, boot ...string) *started {
		args := []string{"join", "--config", cfg, "--identity", filepath.Join(dir, fmt.Sprintf("id-%d", i)),
			"--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json"}
		for _, b := range boot {
			args = append(args, "--bootstrap", b)
		}
		return startAs(t, env, args...)
	}
	addrRe := regexp.MustCompile(`listening on (/ip4/127\.0\.0\.1/tcp/\d+/p2p/\S+)`)
	first = join(0, nil)
	first.until(t, "its address", func(out string) bool { return addrRe.MatchString(out) })
	return join, first, addrRe.FindStringSubmatch(string(first.buf))[1]
}

// TestByzantinePeerIsNamedAndDropped: four `ringtrain join` processes,
// one of them an attacker: in sparse DiLoCo rounds with "robust": {}, it
// sends its pseudo-gradient flipped, or scaled; in a ring that syncs
// every step with "update_checks", its gradients scaled, those of its
// first step again at every step (a replay), or flipped (caught by the
// audits, which recompute its gradients on its batch). The three honest
// peers name it with the evidence, re-form without it and finish the job
// on one hash; the attacker ends, named, with a non-zero status.
func TestByzantinePeerIsNamedAndDropped(t *testing.T) {
	const rounds = `"sync": {"every": 4, "sparse": {"fraction": 0.1, "bits": 4}, "robust": {}}`
	for _, tc := range []struct{ name, kind, job, says string }{
		{"rounds flip", "flip", rounds, "pseudo-gradients stood apart"},
		{"rounds scale", "scale", rounds, "pseudo-gradients stood apart"},
		{"every step scale", "scale", `"update_checks": {"window": 4}`, "sketches of their gradients stood apart"},
		{"every step scale, guarded", "scale", `"update_checks": {}, "grad_norm_guard": 5`, "norm of their gradients was over"},
		{"every step replay", "replay", `"update_checks": {}`, "a replay"},
		{"every step flip, audited", "flip", `"update_checks": {"audit_every": 2}`, "recomputed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kind := tc.kind
			dir := t.TempDir()
			cfg := writeJobFile(t, dir, `"name": "byz", "world_size": 4, "min_world_size": 3, "epochs": 3, `+tc.job)
			join, first, boot := firstPeer(t, dir, cfg)
			peers := []*started{first, join(1, nil, boot), join(2, nil, boot), join(3, []string{"RINGTRAIN_ATTACK=" + kind}, boot)}
			outs := make([]string, len(peers))
			errs := make([]error, len(peers))
			var wg sync.WaitGroup
			for i, p := range peers {
				wg.Go(func() {
					stuck := time.AfterFunc(3*time.Minute, func() { p.cmd.Process.Kill() })
					defer stuck.Stop()
					rest, _ := io.ReadAll(p.out)
					errs[i] = p.cmd.Wait()
					outs[i] = string(append(p.buf, rest...))
				})
			}
			wg.Wait()
			all := strings.Join(outs, "\n")
			if !strings.Contains(outs[3], "this peer sends its updates altered") || errs[3] == nil || !strings.Contains(outs[3], tc.says) {
				t.Errorf("the attacker: exit %v; want it to say it attacks, be named and end non-zero\n%s", errs[3], tails(outs[3]))
			}
			var hashes []string
			for i := range 3 {
				if errs[i] != nil || !strings.Contains(outs[i], tc.says) || !strings.Contains(outs[i], `"dropped":[`) ||
					!strings.Contains(outs[i], "re-forming the ring without them") {
					t.Errorf("honest peer %d: exit %v; want it to name the attacker with the evidence and finish\n%s", i, errs[i], tails(outs[i]))
				}
				if m := regexp.MustCompile(`"world_size":3,"epochs":3,.*"param_hash":"([0-9a-f]{64})"`).FindStringSubmatch(outs[i]); m != nil {
					hashes = append(hashes, m[1])
				}
			}
			t.Log(regexp.MustCompile(`.*re-forming the ring without them.*`).FindString(outs[0]))
			if len(hashes) != 3 || hashes[0] != hashes[1] || hashes[1] != hashes[2] {
				t.Errorf("honest peers' summaries: hashes %v; want three equal ones of a world of 3\n%s", hashes, tails(all))
			}
		})
	}
}

// TestDroppedLiarIsNotAdmittedBack: the attacker, named and dropped,
// started again with its identity (and no attack) waits as a standby and
// is never admitted while the other three train on to the job's end —
// before, the members took it back as a newcomer.
func TestDroppedLiarIsNotAdmittedBack(t *testing.T) {
	dir := t.TempDir()
	// No norm guard: late in a long run on 2,000 images an honest peer's
	// norm can be over 5 × the median three steps in a row.
	cfg := writeJobFile(t, dir, `"name": "byz-back", "world_size": 4, "min_world_size": 3, "epochs": 40, "update_checks": {"window": 4}`)
	join, first, boot := firstPeer(t, dir, cfg)
	honest := []*started{first, join(1, nil, boot), join(2, nil, boot)}
	// Their output is read as it comes: a peer whose pipe is full stalls
	// its step, and the ring with it.
	outs, errs := make([]string, len(honest)), make([]error, len(honest))
	var wg sync.WaitGroup
	for i, p := range honest {
		wg.Go(func() {
			stuck := time.AfterFunc(4*time.Minute, func() { p.cmd.Process.Kill() })
			defer stuck.Stop()
			rest, _ := io.ReadAll(p.out)
			errs[i], outs[i] = p.cmd.Wait(), string(append(p.buf, rest...))
		})
	}
	liar := join(3, []string{"RINGTRAIN_ATTACK=scale"}, boot)
	liar.until(t, "its naming", func(out string) bool { return strings.Contains(out, "sketches of their gradients stood apart") })
	go io.Copy(io.Discard, liar.out)
	liar.cmd.Wait()
	back := join(3, nil, boot)
	back.until(t, "waiting as a standby", func(out string) bool { return strings.Contains(out, "waiting as a standby") })
	backOut := make(chan []byte, 1)
	go func() { rest, _ := io.ReadAll(back.out); backOut <- rest }()
	wg.Wait()
	for i, out := range outs {
		if errs[i] != nil || !strings.Contains(out, `"world_size":3,"epochs":40`) {
			t.Errorf("honest peer %d: %v; want the job's end in a ring of 3\n%s", i, errs[i], tails(out))
		}
	}
	back.cmd.Process.Kill()
	back.cmd.Wait()
	if out := string(append(back.buf, <-backOut...)); strings.Contains(out, "admitted to the ring") || strings.Contains(out, `"message":"ring formed"`) {
		t.Errorf("the liar, started again, was taken back:\n%s", tails(out))
	}
}
