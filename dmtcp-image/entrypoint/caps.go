package main

import "github.com/fogdeploy/fogdeploy/internal/capset"

// Linux capability numbers used here (linux/capability.h).
const (
	capSetpcap   = 8
	capSysChroot = 18
	capSysAdmin  = 21
	capSysTime   = 25 // criu restore sets the clock offsets of a time namespace
	capLast      = capset.Last
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

// dropBounding removes caps from the bounding set of every thread only
// (needs CAP_SETPCAP): the process keeps using them, but no later execve
// gets them back.
func dropBounding(caps ...int) error { return capset.DropBounding(capset.Process, caps...) }

// dropCaps removes caps from every thread of this process (capset.Drop):
// bounding (CAP_SETPCAP should be dropped last), effective, permitted,
// inheritable and ambient sets.
func dropCaps(caps ...int) error { return capset.Drop(capset.Process, caps...) }
