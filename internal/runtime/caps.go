package runtime

import (
	"fmt"
	"strings"
)

// capNames returns the Linux capabilities by number (linux/capability.h).
// numCaps is the number of Linux capabilities capNames knows.
const numCaps = 41

func capNames() [numCaps]string {
	return [numCaps]string{
		"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
		"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
		"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
		"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
		"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
		"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
	}
}

// dockerDefaultCaps returns the capability set dockerd gives a container
// that neither adds nor drops any (moby oci/caps/defaults.go).
func dockerDefaultCaps() []string {
	return []string{
		"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID", "SETUID",
		"SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE",
	}
}

// CapMask returns the bit mask of capability names, as /proc/PID/status
// shows it in CapEff ("SYS_ADMIN" and "CAP_SYS_ADMIN" are both accepted).
func CapMask(caps []string) (uint64, error) {
	var m uint64
	for _, c := range caps {
		n, err := capNumber(c)
		if err != nil {
			return 0, err
		}
		m |= 1 << n
	}
	return m, nil
}

// EffectiveCaps computes the capability set dockerd gives a container
// with these CapAdd and CapDrop lists: its default set, emptied by "ALL" in
// drop, less drop, plus add ("ALL" in add means every capability).
func EffectiveCaps(add, drop []string) (uint64, error) {
	base := dockerDefaultCaps()
	for _, d := range drop {
		if strings.EqualFold(d, "ALL") {
			base = nil
		}
	}
	m, err := CapMask(base)
	if err != nil {
		return 0, err
	}
	for _, d := range drop {
		if strings.EqualFold(d, "ALL") {
			continue
		}
		n, err := capNumber(d)
		if err != nil {
			return 0, err
		}
		m &^= 1 << n
	}
	for _, a := range add {
		if strings.EqualFold(a, "ALL") {
			m |= 1<<numCaps - 1
			continue
		}
		n, err := capNumber(a)
		if err != nil {
			return 0, err
		}
		m |= 1 << n
	}
	return m, nil
}

func capNumber(name string) (uint, error) {
	n := strings.TrimPrefix(strings.ToUpper(name), "CAP_")
	for i, c := range capNames() {
		if c == n {
			return uint(i), nil
		}
	}
	return 0, fmt.Errorf("unknown capability %q: %w", name, ErrInvalidSpec)
}
