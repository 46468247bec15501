package engine_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// shmApp keeps a token in a POSIX shared memory file (/dev/shm) and in a
// System V shared memory segment, as PostgreSQL does, and answers each
// connection with what both hold.
const shmApp = `
import ctypes, os, socket, sys
from multiprocessing import shared_memory
token = sys.argv[1].encode()
posix = shared_memory.SharedMemory(name="fogdeploy-shm-test", create=True, size=64)
posix.buf[:len(token)] = token
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
seg = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
if seg < 0: sys.exit("shmget: errno %d" % ctypes.get_errno())
addr = libc.shmat(seg, None, 0)
ctypes.memmove(addr, token, len(token))
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7070)); s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    sysv = ctypes.string_at(addr, len(token))
    c.sendall(bytes(posix.buf[:len(token)]) + b" " + sysv + b"\n"); c.close()
`

// TestCRIUSharedMemory: an app in a root that keeps state in /dev/shm
// and in a System V segment is checkpointed by CRIU and restored with
// both (before, criu refused to dump the segment, and a restore found no
// /dev/shm file). A copy of the image without its /dev/shm files fails to
// restore, at once.
func TestCRIUSharedMemory(t *testing.T) {
	e := engine.NewCRIU(newConfig(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.Check(ctx); err != nil {
		testenv.Unavailable(t, testenv.CRIU, err.Error())
	}
	root := testenv.PythonRootfs(t, testenv.CRIU)
	// The root's /dev is the host's: a file a failed run left is gone.
	shmFile := "/dev/shm/fogdeploy-shm-test"
	_ = os.Remove(shmFile)
	t.Cleanup(func() { _ = os.Remove(shmFile) })
	log := engine.NewLogTail(50)
	p, err := e.Launch(ctx, engine.LaunchSpec{Argv: []string{"python3", "-c", shmApp, "tok-41"}, Root: root, NetNS: true,
		Stdout: log, Stderr: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(context.Background()) })
	ask := func(p engine.Process) string {
		t.Helper()
		var got string
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			c, err := engine.NetNSDialer(p.Pid())(ctx, "tcp", "127.0.0.1:7070")
			if err == nil {
				got, _ = bufio.NewReader(c).ReadString('\n')
				c.Close()
				return strings.TrimSpace(got)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("pid %d did not answer within 20 s\n%s", p.Pid(), log)
		return ""
	}
	if got := ask(p); got != "tok-41 tok-41" {
		t.Fatalf("launched: %q; want both tokens", got)
	}
	img, err := e.Checkpoint(ctx, p, filepath.Join(t.TempDir(), "gen1"))
	if err != nil {
		t.Fatalf("checkpoint: %v\n%s", err, log)
	}
	// Without the /dev/shm file the image saved, criu cannot restore the
	// mapping: the restore fails at once, nothing left waiting (it once
	// waited for ever on the namespace's init).
	bare := filepath.Join(t.TempDir(), "bare")
	if out, err := exec.Command("cp", "-a", img.Dir, bare).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := os.RemoveAll(filepath.Join(bare, "devshm")); err != nil {
		t.Fatal(err)
	}
	noShm := img
	noShm.Dir = bare
	bctx, bcancel := context.WithTimeout(ctx, 30*time.Second)
	if r, err := e.Restore(bctx, noShm, engine.RestoreSpec{Root: root, NetNS: true, Stdout: log, Stderr: log}); err == nil {
		_ = r.Stop(ctx)
		t.Errorf("restored without the /dev/shm file; want criu to refuse")
	} else if !errors.Is(err, engine.ErrRestore) || bctx.Err() != nil {
		t.Errorf("restore without the /dev/shm file: %v (context %v); want ErrRestore at once", err, bctx.Err())
	}
	bcancel()
	q, err := e.Restore(ctx, img, engine.RestoreSpec{Root: root, NetNS: true, Stdout: log, Stderr: log})
	if err != nil {
		t.Fatalf("restore: %v\n%s", err, log)
	}
	t.Cleanup(func() { _ = q.Stop(context.Background()) })
	if got := ask(q); got != "tok-41 tok-41" {
		t.Errorf("restored: %q; want both tokens as checkpointed", got)
	}
}
