//go:build !no_ceph

package cephstore

import (
	"errors"
	"testing"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Only an address that names one client instance is ever blocklisted: an
// entry without a nonce would fence every client of the host.
func TestOneClient(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:0/979340955", "10.0.0.7:6801/12", "v2:10.0.0.7:0/3711308098", "[::1]:0/42"} {
		if err := oneClient(ok); err != nil {
			t.Errorf("oneClient(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:0/0", "127.0.0.1:0", "127.0.0.1/5", "127.0.0.1:0/", "127.0.0.1:0/x", ":0/5", "127.0.0.1:0/99999999999"} {
		if err := oneClient(bad); !errors.Is(err, layering.ErrInvalid) {
			t.Errorf("oneClient(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
