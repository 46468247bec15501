// Package cephstore implements layering.Backend on a real Ceph cluster with
// go-ceph (librados + librbd). It needs cgo and the Ceph libraries; build
// with the Ceph release tag (`-tags pacific` for Ceph 16). Build with
// `-tags no_ceph` to leave it out.
package cephstore

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"
)

// Config says how to reach the cluster and which pool to use.
type Config struct {
	// Conf is the path of ceph.conf (mon addresses). Required.
	Conf string
	// Keyring is the path of the client keyring. Empty: the conf's.
	Keyring string
	// ID is the cephx user without "client." (default "admin").
	ID string
	// Pool is the RBD pool (default "fogdeploy").
	Pool string
	// Timeout bounds connecting and each monitor or OSD operation, so a
	// cluster that is down gives an error instead of a hang (default 10s).
	Timeout time.Duration
	// Stall bounds one librbd call that opens an image (every image
	// operation starts with one): one that has not returned by then is
	// given up on, and the store connects again (default 3 × Timeout).
	Stall time.Duration
	// Log receives what the store recovers from on its own, such as a
	// stalled call (default: discarded).
	Log *slog.Logger
	// BusyWait bounds Store.RemoveUnmapped, which evicts the watchers of
	// dead clients and retries while an image is busy (default
	// DefaultBusyWait).
	BusyWait time.Duration
}

// DefaultBusyWait is the default Config.BusyWait: past the OSDs' default
// osd_client_watch_timeout (30 s), so that the watch of a dead client is
// waited out where it cannot be evicted (a cephx user without the
// `osd blocklist` capability of `profile rbd`).
const DefaultBusyWait = 40 * time.Second

// CatalogObject is the RADOS object whose omap holds environment names.
const CatalogObject = "fogdeploy.catalog"

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		c.ID = "admin"
	}
	if c.Pool == "" {
		c.Pool = "fogdeploy"
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.BusyWait == 0 {
		c.BusyWait = DefaultBusyWait
	}
	if c.Stall == 0 {
		c.Stall = 3 * c.Timeout
	}
	return c
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Conf == "" {
		errs = append(errs, errors.New("ceph conf: no path given: pass --ceph-conf, set FOGDEPLOY_CEPH_CONF, or run `make dev-up`"))
	} else if _, err := os.Stat(c.Conf); err != nil {
		errs = append(errs, fmt.Errorf("ceph conf %s: %s", c.Conf, describe(err)))
	}
	if c.Keyring != "" {
		if st, err := os.Stat(c.Keyring); err != nil {
			errs = append(errs, fmt.Errorf("ceph keyring %s: %s", c.Keyring, describe(err)))
		} else if st.Mode().Perm()&0o077 != 0 {
			errs = append(errs, fmt.Errorf("ceph keyring %s is readable by group or others (mode %04o): run `chmod 600 %s`", c.Keyring, st.Mode().Perm(), c.Keyring))
		}
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("ceph timeout %s is negative: use a positive duration such as 10s", c.Timeout))
	}
	if c.Stall < 0 {
		errs = append(errs, fmt.Errorf("ceph stall bound %s is negative: use a positive duration such as 30s", c.Stall))
	}
	if c.BusyWait < 0 {
		errs = append(errs, fmt.Errorf("ceph busy wait %s is negative: use a positive duration such as 40s", c.BusyWait))
	}
	return errors.Join(errs...)
}

// describe says why a path cannot be used, without repeating the path.
func describe(err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "does not exist"
	case errors.Is(err, fs.ErrPermission):
		return "permission denied"
	}
	return err.Error()
}
