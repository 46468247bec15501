package main

import (
	"fmt"
	"syscall"
	"unsafe"
)

// Linux capability numbers used here (linux/capability.h).
const (
	capSetpcap   = 8
	capSysChroot = 18
	capSysAdmin  = 21
	capSysTime   = 25 // criu restore sets the clock offsets of a time namespace
	capLast      = 40 // CAP_CHECKPOINT_RESTORE, the highest in Linux 6.x
)

// appCaps are the capabilities a CRIU container's app keeps (nocaps
// -keep): what a daemon started as root needs to give its workers another
// user and to own its files (nginx: a root master, www-data workers).
// They are Docker's default set less MKNOD, NET_RAW, SETFCAP, SETPCAP,
// SYS_CHROOT and AUDIT_WRITE; runtime.CRIUAppCapabilities lists the same.
// A DMTCP app keeps none.
var appCaps = map[string]int{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7, "NET_BIND_SERVICE": 10,
}

// appCapNames is appCaps' keys, in capability order.
const appCapNames = "CHOWN,DAC_OVERRIDE,FOWNER,FSETID,KILL,SETGID,SETUID,NET_BIND_SERVICE"

const (
	prCapbsetRead        = 23
	prCapbsetDrop        = 24
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

// dropBounding removes caps from the bounding set only (needs CAP_SETPCAP):
// the process keeps using them, but no later execve gets them back.
func dropBounding(caps ...int) error {
	for _, c := range caps {
		if r, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prCapbsetRead, uintptr(c), 0); r != 1 {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prCapbsetDrop, uintptr(c), 0); e != 0 {
			return fmt.Errorf("drop capability %d from the bounding set (needs CAP_SETPCAP): %w", c, e)
		}
	}
	return nil
}

// dropCaps removes caps from every thread of this process: from the bounding
// set (so that a later execve as root cannot get them back; this needs
// CAP_SETPCAP, which should be dropped last) and from the effective,
// permitted, inheritable and ambient sets. The bounding-set error is
// returned, after the other sets were cleared anyway, when CAP_SETPCAP is
// missing.
//
// Implements: prctl(PR_CAPBSET_DROP), prctl(PR_CAP_AMBIENT_CLEAR_ALL),
// capset(2), on all threads (syscall.AllThreadsSyscall; needs CGO_ENABLED=0).
func dropCaps(caps ...int) error {
	var bsetErr error
	for _, c := range caps {
		if r, _, _ := syscall.RawSyscall(syscall.SYS_PRCTL, prCapbsetRead, uintptr(c), 0); r != 1 {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prCapbsetDrop, uintptr(c), 0); e != 0 && bsetErr == nil {
			bsetErr = fmt.Errorf("drop capability %d from the bounding set (needs CAP_SETPCAP): %w", c, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prCapAmbient, prCapAmbientClearAll, 0); e != 0 {
		if e == syscall.ENOTSUP {
			return fmt.Errorf("clear ambient capabilities: %w (build the entrypoint with CGO_ENABLED=0)", e)
		}
		return fmt.Errorf("clear ambient capabilities: %w", e)
	}
	hdr := capHeader{version: linuxCapabilityV3}
	var data [2]capData
	if _, _, e := syscall.RawSyscall(syscall.SYS_CAPGET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capget: %w", e)
	}
	for _, c := range caps {
		mask := ^uint32(1 << (uint(c) % 32))
		d := &data[c/32]
		d.effective &= mask
		d.permitted &= mask
		d.inheritable &= mask
	}
	if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return bsetErr
}
