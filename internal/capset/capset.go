// Package capset drops Linux capabilities from the bounding, effective,
// permitted, inheritable and ambient sets, of one thread or of every thread
// of the process. The instance sandboxes use it: the light container's
// entrypoint for its whole process before it becomes the app, the engines
// for the locked thread that starts an app's processes.
//
// Implements: prctl(PR_CAPBSET_DROP), prctl(PR_CAP_AMBIENT_CLEAR_ALL),
// prctl(PR_SET_NO_NEW_PRIVS), capget(2), capset(2).
package capset

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Last is the highest capability number this package knows
// (CAP_CHECKPOINT_RESTORE, the highest in Linux 6.x).
const Last = 40

// All lists every capability number, 0 to Last.
func All() []int {
	all := make([]int, Last+1)
	for i := range all {
		all[i] = i
	}
	return all
}

// Scope says which threads a change applies to.
type Scope int

const (
	// Thread changes the calling thread only: lock it to its goroutine
	// and never give it back to the Go runtime (internal/osthread). The
	// processes it starts inherit its sets.
	Thread Scope = iota
	// Process changes every thread of the process
	// (syscall.AllThreadsSyscall; needs CGO_ENABLED=0).
	Process
)

func (s Scope) syscall(trap, a1, a2, a3 uintptr) (uintptr, syscall.Errno) {
	if s == Process {
		r, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3)
		return r, e
	}
	r, _, e := syscall.RawSyscall(trap, a1, a2, a3)
	return r, e
}

const (
	prCapbsetRead        = 23
	prCapbsetDrop        = 24
	prSetNoNewPrivs      = 38
	prCapAmbient         = 47
	prCapAmbientClearAll = 4
	linuxCapabilityV3    = 0x20080522
)

type capHeader struct {
	version uint32
	pid     int32
}

type capData struct {
	effective, permitted, inheritable uint32
}

// DropBounding removes caps from the bounding set only (needs
// CAP_SETPCAP): the threads keep using them, but no later execve gets them
// back.
func DropBounding(s Scope, caps ...int) error {
	for _, c := range caps {
		if r, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prCapbsetRead, uintptr(c), 0); r != 1 {
			continue
		}
		if _, e := s.syscall(syscall.SYS_PRCTL, prCapbsetDrop, uintptr(c), 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set (needs CAP_SETPCAP): %w", c, e)
		}
	}
	return nil
}

// Drop removes caps from the bounding set (so that a later execve as root
// cannot get them back; this needs CAP_SETPCAP, which should be dropped
// last) and from the effective, permitted, inheritable and ambient sets.
// The bounding-set error is returned, after the other sets were cleared
// anyway, when CAP_SETPCAP is missing.
func Drop(s Scope, caps ...int) error {
	var bsetErr error
	for _, c := range caps {
		if err := DropBounding(s, c); err != nil && bsetErr == nil {
			bsetErr = err
		}
	}
	if err := clearAmbient(s); err != nil {
		return err
	}
	return errorsFirst(update(s, func(d *capData, mask uint32) {
		d.effective &= mask
		d.permitted &= mask
		d.inheritable &= mask
	}, caps), bsetErr)
}

// ForExec makes whatever the threads of s start next hold no capability,
// even as uid 0, and unable to gain one (no_new_privs: a set-user-ID file
// gives none), while the threads keep their own effective and permitted
// sets for the work that remains before the execve (a chroot). It clears
// the bounding, inheritable and ambient sets.
func ForExec(s Scope) error {
	if err := DropBounding(s, All()...); err != nil {
		return err
	}
	if err := clearAmbient(s); err != nil {
		return err
	}
	if err := update(s, func(d *capData, mask uint32) { d.inheritable &= mask }, All()); err != nil {
		return err
	}
	if _, e := s.syscall(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0); e != 0 {
		return fmt.Errorf("set no_new_privs: %w", e)
	}
	return nil
}

func clearAmbient(s Scope) error {
	if _, e := s.syscall(syscall.SYS_PRCTL, prCapAmbient, prCapAmbientClearAll, 0); e != 0 {
		if e == syscall.ENOTSUP {
			return fmt.Errorf("clear ambient capabilities: %w (build with CGO_ENABLED=0)", e)
		}
		return fmt.Errorf("clear ambient capabilities: %w", e)
	}
	return nil
}

// update reads the calling thread's sets, applies clear with the mask of
// each of caps, and writes them to the threads of s.
func update(s Scope, clear func(d *capData, mask uint32), caps []int) error {
	hdr := capHeader{version: linuxCapabilityV3}
	var data [2]capData
	if _, _, e := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capget: %w", e)
	}
	for _, c := range caps {
		clear(&data[c/32], ^uint32(1<<(uint(c)%32)))
	}
	if _, e := s.syscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

func errorsFirst(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
