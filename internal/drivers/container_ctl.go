// The container driver's control of a waiting or serving instance: its control directory
// (Run.CtlPath, bound at /fog/ctl) with the order that starts it and the release and rearm that
// recycle it (Recycler), and the raise of an instance restored ahead to the normal weight (Raiser).

package drivers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/cgroup"
	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"golang.org/x/sys/unix"
)

// ordered reports whether Start has ordered the instance to run.
func ordered(h Handle) bool {
	return ctlfs.Dir(h.CtlPath).IsFile(instancectl.Order)
}

// writeOrder writes the order file.
func writeOrder(h Handle) error {
	return writeCtl(h.CtlPath, instancectl.Order, instancectl.OrderBody{Deployment: h.Deployment, MemoryMerge: h.MemoryMerge, Lazy: h.Lazy})
}

// writeCtl writes v as JSON to control file name in dir, whole (a
// rename), so that the entrypoint never reads half of it. The app can
// write into dir (ctlfs): no link of its is followed.
func writeCtl(dir, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := ctlfs.Dir(dir).WriteFile(name, b, 0o644); err != nil {
		return fmt.Errorf("control file %s of the instance: %w", name, err)
	}
	return nil
}

var _ Recycler = (*Container)(nil)

// recycleWait bounds the wait for a recycled container's entrypoint to
// release its instance.
const recycleWait = 15 * time.Second

// Recycle implements Recycler: it lowers the container to background
// priority, asks the entrypoint to end the app (instancectl.Release), waits
// for its answer, resets the root while the container holds no mount in
// it, and rearms it (instancectl.Rearm): its entrypoint prepares the root
// and the coordinator again and waits for Start's next order. An instance
// created without Handle.Recycle, or whose entrypoint found it cannot serve
// again, is ErrNotRecyclable.
func (c *Container) Recycle(ctx context.Context, h Handle, reset func(context.Context) error) (Handle, error) {
	if !h.Recycle || h.CtlPath == "" {
		return Handle{}, fmt.Errorf("container %s: created to serve once: %w", shortRef(h.Ref), ErrNotRecyclable)
	}
	ctl := ctlfs.Dir(h.CtlPath)
	for _, f := range []string{instancectl.Released, instancectl.Rearm} {
		if err := ctl.Remove(f); err != nil {
			return Handle{}, err
		}
	}
	// The release, the entrypoint's preparation for the next order and
	// its warm read run below the serving instances already.
	if c.Priority != nil {
		st, err := c.state(ctx, h)
		if err != nil {
			return Handle{}, err
		}
		if _, err := c.Priority.Set(st.Pid, cgroup.Background); err != nil {
			return Handle{}, fmt.Errorf("lower the priority of container %s: %w", shortRef(h.Ref), err)
		}
		h.Background = true
	}
	if err := writeCtl(h.CtlPath, instancectl.Release, struct{}{}); err != nil {
		return Handle{}, err
	}
	deadline := time.Now().Add(recycleWait)
	var b []byte
	for {
		var err error
		if b, err = ctl.ReadFile(instancectl.Released); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return Handle{}, fmt.Errorf("container %s did not release its instance within %s: %w", shortRef(h.Ref), recycleWait, ErrNotRecyclable)
		}
		if st, err := c.state(ctx, h); err != nil || !st.Running {
			return Handle{}, fmt.Errorf("container %s ended instead of releasing its instance: %w", shortRef(h.Ref), errors.Join(err, ErrNotRecyclable))
		}
		select {
		case <-ctx.Done():
			return Handle{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	var ans instancectl.ReleasedBody
	if err := json.Unmarshal(b, &ans); err != nil {
		return Handle{}, fmt.Errorf("container %s: release answer %q: %w", shortRef(h.Ref), b, ErrNotRecyclable)
	}
	if ans.Error != "" {
		return Handle{}, fmt.Errorf("container %s: %s: %w", shortRef(h.Ref), ans.Error, ErrNotRecyclable)
	}
	if err := reset(ctx); err != nil {
		return Handle{}, err
	}
	if err := writeCtl(h.CtlPath, instancectl.Rearm, struct{}{}); err != nil {
		return Handle{}, err
	}
	h.Deployment = ""
	return h, nil
}

var _ Raiser = (*Container)(nil)

// Raise implements Raiser: the container's cgroup gets the normal weights.
func (c *Container) Raise(ctx context.Context, h Handle) (Handle, error) {
	if !h.Background || c.Priority == nil {
		return h, nil
	}
	st, err := c.state(ctx, h)
	if err != nil {
		return Handle{}, err
	}
	if !st.Running {
		return Handle{}, fmt.Errorf("raise container %s: it is not running (%s): %w", shortRef(h.Ref), st.Status, spec.ErrNotFound)
	}
	return c.raise(st.Pid, h)
}

// raise gives the cgroup of pid, h's container's, the normal weights if h
// waited at background priority.
func (c *Container) raise(pid int, h Handle) (Handle, error) {
	if !h.Background || c.Priority == nil {
		return h, nil
	}
	if _, err := c.Priority.Set(pid, cgroup.Normal); err != nil {
		return Handle{}, fmt.Errorf("raise the priority of container %s: %w", shortRef(h.Ref), err)
	}
	h.Background = false
	return h, nil
}

// watchExit watches instance h's main process (Handle.Pid, while it is
// still its container's): the channel is closed once it has exited; nil
// where it cannot be watched (no PID, a runtime without host processes,
// a kernel without pidfds).
func (c *Container) watchExit(h Handle) (<-chan struct{}, func()) {
	if h.Pid <= 0 || h.CtlPath == "" || !c.ownsPid(h) {
		return nil, func() {}
	}
	fd, err := unix.PidfdOpen(h.Pid, 0)
	if err != nil {
		return nil, func() {}
	}
	if !c.ownsPid(h) { // the PID's process changed before the pidfd pinned it
		_ = unix.Close(fd)
		return nil, func() {}
	}
	_ = ctlfs.Dir(h.CtlPath).Remove(instancectl.Checkpointed) // an earlier checkpoint's
	exited, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n, err := unix.Poll(fds, 100); n > 0 || err != nil && !errors.Is(err, unix.EINTR) {
				close(exited)
				return
			}
		}
	}()
	var once sync.Once
	return exited, func() { once.Do(func() { close(stop) }) }
}

// ownsPid reports whether h.Pid is a process of h's container (its cgroup
// names the container).
func (c *Container) ownsPid(h Handle) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", h.Pid))
	return err == nil && len(h.Ref) >= 12 && bytes.Contains(b, []byte(h.Ref))
}

// reported waits until instance h's main process has exited (exited
// closed) and returns the checkpoint its entrypoint reported in the
// control directory; false if it reported none (the caller asks the
// runtime).
func (c *Container) reported(ctx context.Context, h Handle, exited <-chan struct{}) (Checkpointed, bool) {
	select {
	case <-exited:
	case <-ctx.Done():
		return Checkpointed{}, false
	}
	b, err := ctlfs.Dir(h.CtlPath).ReadFile(instancectl.Checkpointed)
	if err != nil {
		return Checkpointed{}, false
	}
	var r instancectl.CheckpointedBody
	if json.Unmarshal(b, &r) != nil || r.Gen <= 0 || r.Bytes <= 0 {
		return Checkpointed{}, false
	}
	return Checkpointed{Gen: r.Gen, Bytes: r.Bytes, MS: r.MS, Exited: true}, true
}
