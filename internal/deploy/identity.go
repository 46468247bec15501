// Identity after restore: every instance restored from one checkpoint
// starts as the same process, with the same random state and the same idea
// of who it is. Before an instance starts, its identity (spec.Identity) is
// written into its root; after a restore, the app's post_restore command
// runs inside it, before the deploy counts it as ready.

package deploy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fogdeploy/fogdeploy/internal/ctlfs"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/instancectl"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// ErrPostRestore: the app's post_restore command failed in a restored
// instance (the error carries its output).
var ErrPostRestore = errors.New("post-restore command failed")

// newSeed draws 16 random bytes as hex.
func newSeed() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeIdentity writes id as spec.IdentityFile inside root (0644, its
// directories 0755 made as needed), atomically. The path is resolved
// without following symbolic links, which the environment controls
// (ctlfs): an environment whose /run is a link is refused.
func writeIdentity(root string, id spec.Identity) error {
	b, err := identityJSON(id)
	if err != nil {
		return err
	}
	rel := strings.TrimPrefix(spec.IdentityFile, "/")
	r := ctlfs.Dir(root)
	if err := r.MkdirAll(path.Dir(rel), 0o755); err != nil {
		return fmt.Errorf("write the instance's identity %s: %w", spec.IdentityFile, err)
	}
	if err := r.WriteFile(rel, b, 0o644); err != nil {
		return fmt.Errorf("write the instance's identity %s: %w", spec.IdentityFile, err)
	}
	return nil
}

// identityJSON is the content of an identity file: id, indented, with a
// final newline.
func identityJSON(id spec.Identity) ([]byte, error) {
	b, err := json.MarshalIndent(id, "", "  ")
	return append(b, '\n'), err
}

// writeIdentityCtl writes id into the control directory of instance h
// (Container), whose entrypoint binds its identity directory read-only at
// spec.IdentityFile's directory in the root: a write to the node's own file
// system, where one into the root goes through the instance's RBD clone
// (rbd-fuse and the OSDs, about 3 ms of the node's CPU per deploy). bound
// is false where the entrypoint has not bound it (an environment whose
// /run is a symbolic link, a container of an older image, an entrypoint
// still preparing the root): the caller then writes into the root too.
func writeIdentityCtl(h drivers.Handle, id spec.Identity) (bound bool, err error) {
	if h.CtlPath == "" {
		return false, nil
	}
	// The app can write into the control directory (ctlfs): no link of
	// its is followed.
	ctl := ctlfs.Dir(h.CtlPath)
	name := path.Join(instancectl.IdentityDir, path.Base(spec.IdentityFile))
	written := false
	if f, err := ctl.OpenFile(name, os.O_WRONLY); err == nil {
		written, err = overwriteIdentity(f, id)
		if err != nil {
			return false, err
		}
	}
	if !written {
		b, err := identityJSON(id)
		if err != nil {
			return false, err
		}
		if err := ctl.WriteFile(name, b, 0o644); errors.Is(err, unix.ENOENT) {
			return false, nil // a control directory made before it had one
		} else if err != nil {
			return false, fmt.Errorf("write the instance's identity %s: %w", spec.IdentityFile, err)
		}
	}
	return ctl.IsFile(instancectl.IdentityBound), nil
}

// overwriteIdentity writes id over the identity file f, in place,
// where one is there already (a slot restored ahead wrote its own): a new
// file renamed over it would be, on ext4, a new inode and the flush of its
// data that a rename over a file starts (auto_da_alloc), about a tenth of
// a pool hit's CPU. The JSON is padded with spaces to the old file's
// length, so that no moment of the write shows a shorter tail of the old
// one; nobody reads the file meanwhile (the slot's app waits for its
// deployment, and post_restore runs after). It reports whether it wrote.
func overwriteIdentity(f *os.File, id spec.Identity) (bool, error) {
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return false, nil
	}
	b, err := identityJSON(id)
	if err != nil {
		return false, err
	}
	if pad := int(st.Size()) - len(b); pad > 0 {
		b = append(b, bytes.Repeat([]byte(" "), pad)...)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return false, fmt.Errorf("write the instance's identity %s: %w", spec.IdentityFile, err)
	}
	return true, nil
}

// writeIdentityWithin is writeIdentity bounded by bound: root is the
// mount of an RBD mapping, whose I/O stalls while the cluster does not
// serve the image, and a deploy must then fail in bounded time. The write
// left behind ends when the I/O does, or with the mapping.
func writeIdentityWithin(ctx context.Context, root string, id spec.Identity, bound time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- writeIdentity(root, id) }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("write the instance's identity %s: no answer within %s: %w", spec.IdentityFile, bound, mapper.ErrStalled)
	case <-ctx.Done():
		return fmt.Errorf("write the instance's identity %s: %w", spec.IdentityFile, ctx.Err())
	}
}

// postRestore runs app's post_restore command in restored instance h, with
// id in its environment, within the app's ready timeout.
func (sg *Stages) postRestore(ctx context.Context, dr drivers.Driver, h drivers.Handle, app spec.App, id spec.Identity) error {
	timeout := readyTimeout(app)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	res, err := dr.Exec(ctx, h, drivers.Exec{Argv: app.PostRestore, Env: id.Env(), User: app.User})
	if err == nil && res.ExitCode == 0 {
		return nil
	}
	why := fmt.Sprintf("exited with code %d", res.ExitCode)
	if err != nil {
		why = err.Error()
	}
	lines := strings.Split(strings.TrimRight(res.Output, "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return engine.WithOutput(hint.With(fmt.Errorf("app %s: post_restore %q %s after %s: %w", app.Name, strings.Join(app.PostRestore, " "), why,
		time.Since(start).Round(time.Millisecond), ErrPostRestore),
		"check post_restore in the app spec: it runs in the restored instance as the app's user, with FOGDEPLOY_* variables"),
		"post_restore", lines)
}

// readyTimeout is app's readiness timeout, or DefaultReadyTimeout.
func readyTimeout(app spec.App) time.Duration {
	if t := time.Duration(app.Ready.Timeout); t > 0 {
		return t
	}
	return spec.DefaultReadyTimeout
}
