//go:build ringtrain_attack

package train

// Attack makes this rank send its pseudo-gradients altered by kind (see
// attack): for the attacker builds of tests and benches only, never the
// default binary.
func (o *LocalSGD) Attack(kind string, seed uint64) error {
	f, err := attack(kind, seed)
	if err != nil {
		return err
	}
	o.tamper = f
	return nil
}
