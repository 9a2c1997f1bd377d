//go:build ringtrain_attack

package train

// Attack makes this rank send its updates altered by kind (see attack):
// its pseudo-gradients if o is set (DiLoCo), else its gradients every
// step. For the attacker builds of tests and benches only, never the
// default binary.
func (r *Replica) Attack(o *LocalSGD, kind string, seed uint64) error {
	f, err := attack(kind, seed)
	if err != nil {
		return err
	}
	if o != nil {
		o.tamper = f
	} else {
		r.tamper = f
	}
	return nil
}
