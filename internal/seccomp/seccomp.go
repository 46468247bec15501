// Package seccomp installs the system-call filter of an instance's
// processes under a confining engine (the host driver). Without
// capabilities, a process of uid 0 can still make some of the calls that
// Docker's default profile denies because what they reach is not
// namespaced: the kernel's keyrings (uid 0's are the node's), bpf,
// perf_event_open, and new user namespaces, in which it would hold every
// capability again. The filter answers EPERM to keyctl, add_key,
// request_key, bpf, perf_event_open, unshare or clone with CLONE_NEWUSER,
// and the calls that opt memory in to the kernel's same-page merging
// (prctl PR_SET_MEMORY_MERGE, madvise MADV_MERGEABLE: an app that merged
// its own pages could time its writes to learn what its neighbours hold;
// only the supervisor of a slot restored ahead opts its app in, see
// internal/ksm); ENOSYS to clone3, whose flags a filter cannot read (the C
// library then uses clone), and to every call of another architecture's
// ABI (i386, x32).
//
// Implements: prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER), classic BPF.
package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is returned on an architecture the filter does not know.
var ErrUnsupported = errors.New("seccomp filter: architecture not supported")

// nativeArch is the AUDIT_ARCH_* of this build's architecture.
var nativeArch = map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}

// Offsets in struct seccomp_data: nr, arch, instruction pointer, args
// (the low 32 bits of args[0] first, little-endian).
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg2 = 32
	x32Bit  = 0x40000000 // __X32_SYSCALL_BIT
)

// denied answer EPERM whatever their arguments.
var denied = []uint32{unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN}

const (
	ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	ret  = unix.BPF_RET | unix.BPF_K
)

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

// Program returns the filter for this build's architecture.
func Program() ([]unix.SockFilter, error) {
	arch, ok := nativeArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnsupported, runtime.GOARCH)
	}
	eperm := stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM))
	enosys := stmt(ret, unix.SECCOMP_RET_ERRNO|uint32(unix.ENOSYS))
	allow := stmt(ret, unix.SECCOMP_RET_ALLOW)
	p := []unix.SockFilter{
		stmt(ld, offArch),
		jump(jeq, arch, 1, 0),
		enosys,
		stmt(ld, offNr),
		jump(jge, x32Bit, 0, 1),
		enosys,
	}
	for _, nr := range denied {
		p = append(p, jump(jeq, nr, 0, 1), eperm)
	}
	p = append(p,
		// prctl(PR_SET_MEMORY_MERGE) and madvise(MADV_MERGEABLE): EPERM.
		jump(jeq, unix.SYS_PRCTL, 0, 4),
		stmt(ld, offArg0),
		jump(jeq, unix.PR_SET_MEMORY_MERGE, 0, 1),
		eperm,
		allow,
		jump(jeq, unix.SYS_MADVISE, 0, 4),
		stmt(ld, offArg2),
		jump(jeq, unix.MADV_MERGEABLE, 0, 1),
		eperm,
		allow,
		jump(jeq, unix.SYS_CLONE3, 0, 1), enosys,
		// unshare or clone: EPERM with CLONE_NEWUSER in their flags.
		jump(jeq, unix.SYS_UNSHARE, 1, 0),
		jump(jeq, unix.SYS_CLONE, 0, 3),
		stmt(ld, offArg0),
		jump(jset, unix.CLONE_NEWUSER, 0, 1),
		eperm,
		allow,
	)
	return p, nil
}

// InstallThread installs the filter on the calling thread, which must
// have no_new_privs set (capset.ForExec sets it); the processes it starts
// inherit it. Lock the thread to its goroutine and never give it back to
// the Go runtime (internal/osthread).
func InstallThread() error {
	p, err := Program()
	if err != nil {
		return err
	}
	prog := unix.SockFprog{Len: uint16(len(p)), Filter: &p[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		return fmt.Errorf("install the seccomp filter: %w", err)
	}
	runtime.KeepAlive(p)
	return nil
}
