package seccomp

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/capset"
	"github.com/fogdeploy/fogdeploy/internal/osthread"
)

// script makes, in one process, the calls the filter denies and those it
// must let through, and prints what each returned.
const script = `
import ctypes, mmap, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    r = libc.syscall(nr, *args)
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())
print("keyctl", call(%d, 0, -4, 0))         # KEYCTL_GET_KEYRING_ID of the user keyring
print("add_key", call(%d, b"fogdeploy-no-such-type", b"t", b"x", 1, -4))  # a type no kernel has: nothing is added
print("request_key", call(%d, b"fogdeploy-no-such-type", b"t", None, 0))
print("bpf", call(%d, 0, None, 0))          # BPF_MAP_CREATE with no attributes
print("perf_event_open", call(%d, None, 0, -1, -1, 0))
print("clone3", call(%d, None, 0))
print("x32", call(%d | 0x40000000))        # getpid through the x32 ABI
# getpid through the i386 ABI (int 0x80), from code mapped executable.
code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
code.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")  # mov eax, 20; int 0x80; ret
r = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(code)))()
print("i386", "ok" if r > 0 else os.strerror(-r))
if os.environ.get("FILTERED"):
    # clone(CLONE_NEWUSER|SIGCHLD): refused before any child exists.
    print("clone-user", call(%d, 0x10000000 | 17, None, None, None, 0))
print("unshare-user", call(%d, 0x10000000)) # unshare(CLONE_NEWUSER)
print("merge-self", call(%d, 67, 1, 0, 0, 0))  # prctl(PR_SET_MEMORY_MERGE, 1)
print("prctl-other", call(%d, 68, 0, 0, 0, 0)) # prctl(PR_GET_MEMORY_MERGE)
m = mmap.mmap(-1, 4 << 12)
a = ctypes.addressof(ctypes.c_char.from_buffer(m))
print("madvise-merge", call(%d, ctypes.c_void_p(a), 4 << 12, 12))  # MADV_MERGEABLE
print("madvise-other", call(%d, ctypes.c_void_p(a), 4 << 12, 4))   # MADV_DONTNEED
t = threading.Thread(target=lambda: None); t.start(); t.join()
print("thread ok")
print("fork", "ok" if os.fork() or os._exit(0) else "")
`

// run runs script with python3 from a thread that holds the filter (and
// no_new_privs, which it needs), or without one.
func run(t *testing.T, filtered bool) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 to make raw system calls")
	}
	var out []byte
	err = osthread.Run(func() error {
		if filtered {
			if err := capset.ForExec(capset.Thread); err != nil {
				return err
			}
			if err := InstallThread(); err != nil {
				return err
			}
		}
		var err error
		cmd := exec.Command(py, "-c", fmt.Sprintf(script, unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY, unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN,
			unix.SYS_CLONE3, unix.SYS_GETPID, unix.SYS_CLONE, unix.SYS_UNSHARE, unix.SYS_PRCTL, unix.SYS_PRCTL, unix.SYS_MADVISE, unix.SYS_MADVISE))
		if filtered {
			cmd.Env = append(cmd.Environ(), "FILTERED=1")
		}
		out, err = cmd.CombinedOutput()
		return err
	})
	if err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	return string(out)
}

func TestFilter(t *testing.T) {
	if _, err := Program(); err != nil {
		t.Skip(err)
	}
	out := run(t, true)
	for _, want := range []string{"keyctl Operation not permitted", "unshare-user Operation not permitted", "thread ok", "fork ok",
		"merge-self Operation not permitted", "madvise-merge Operation not permitted", "prctl-other ok", "madvise-other ok",
		"add_key Operation not permitted", "request_key Operation not permitted", "bpf Operation not permitted",
		"perf_event_open Operation not permitted", "clone-user Operation not permitted",
		"clone3 Function not implemented", "x32 Function not implemented", "i386 Function not implemented"} {
		if !strings.Contains(out, want) {
			t.Errorf("under the filter, want %q in:\n%s", want, out)
		}
	}
	// The same calls without the filter: what it changes.
	out = run(t, false)
	// (x32 may be off in the kernel itself; i386 and clone3 answer.)
	for _, want := range []string{"keyctl ok", "madvise-merge ok", "i386 ok", "clone3 Invalid argument", "add_key No such device"} {
		if !strings.Contains(out, want) {
			t.Errorf("without the filter, want %q in:\n%s", want, out)
		}
	}
}
