package p2p

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/libp2p/go-libp2p/core/crypto"
)

// ErrOpenKey means a key file is readable by others than its owner.
var ErrOpenKey = errors.New("p2p: key file open to others")

// LoadOrCreateIdentity returns the private key stored at path, creating an
// Ed25519 key there (mode 0600) on first use, so a machine keeps its peer ID
// across restarts. The file is written to a temporary name and renamed, so
// a crash never leaves half a key.
//
// A key that others than its owner may read is refused, as ssh refuses
// one: anyone who can read it can be this peer.
func LoadOrCreateIdentity(path string) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if st, err := os.Stat(path); err == nil && st.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("p2p: identity %s is readable by others (mode %04o): anyone who reads it can be this peer; chmod 600 it: %w",
				path, st.Mode().Perm(), ErrOpenKey)
		}
		k, err := crypto.UnmarshalPrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("p2p: identity %s is not a libp2p private key: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("p2p: identity: %w", err)
	}
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		return nil, fmt.Errorf("p2p: generating identity: %w", err)
	}
	b, err = crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("p2p: encoding identity: %w", err)
	}
	if err := writeFileAtomic(path, b, 0o600); err != nil {
		return nil, fmt.Errorf("p2p: saving identity: %w", err)
	}
	return k, nil
}

func writeFileAtomic(path string, b []byte, mode os.FileMode) (err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
