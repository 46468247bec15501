// Package mapper maps RBD images on a node and mounts their ext4
// filesystems: the node side of the paper's environment and checkpoint
// images (map → mount → run → unmount → unmap).
//
// # Backends
//
// A Backend turns an image into a block device. Three talk to Ceph:
//
//   - krbd: `rbd device map` → /dev/rbdN (kernel client, fastest).
//   - nbd: `rbd-nbd map` → /dev/nbdN (userspace librbd, nbd module).
//   - fuse: one `rbd-fuse -r IMAGE` process exposes the image as a file,
//     `losetup` turns it into /dev/loopN. Needs no rbd/nbd module, only
//     FUSE and loop; it cannot map snapshots (ErrUnsupported).
//
// and one serves tests: file, a loop device over a local file that
// Config.FilePath names. Backend "auto" probes krbd, nbd and fuse in that
// order and takes the first usable one; Mapper.Choice says which and why.
//
// # Running a container on a clone
//
//	m, err := mapper.New(ctx, mapper.Config{StateDir: dir, CephConf: conf, Keyring: kr}, log)
//	mp, err := m.MapAndMount(ctx, mapper.Image{Pool: "fogdeploy", Name: clone}, rootfs, mapper.MountOptions{})
//	// ... the container runs on rootfs ...
//	err = m.Release(ctx, mp.ID) // umount, detach, forget
//
// # Importing into a blank image
//
// MountOptions.Format formats a device on which `blkid -p` finds nothing
// (`mkfs.ext4 -E nodiscard -q`), and leaves any other device alone.
//
// # Snapshotting a mounted clone
//
// Freeze (`fsfreeze -f`), snapshot the image with the layering store, Thaw
// (`fsfreeze -u`). The snapshot is then a consistent ext4 filesystem.
//
// # Records and crash recovery
//
// Each mapping has a record, Config.StateDir/mappings/<id>.json, replaced
// atomically (temp file, fsync, rename). Each resource is written into the
// record before it is created (intent) and its identity right after (loop
// device, rbd-fuse PID and start time, device number of the mount). The
// mappings themselves outlive the process: rbd-fuse runs in its own session
// and loop, rbd and nbd devices belong to the kernel. After a crash, a new
// Mapper on the same StateDir calls Recover, which undoes exactly what the
// records describe, verifying identity first (a loop device's backing file,
// the mount's device number in /proc/self/mountinfo, a process's start time
// and command line), and skips what is already gone.
//
// # A cluster that stops answering
//
// rbd-fuse retries a request that timed out without end, and a process
// reading its loop device (losetup, mount, umount, an app) then waits in
// the kernel, where no signal reaches it. Every step that does I/O on a
// mapping is therefore bounded by Config.Timeout: when one overruns it,
// the mapping's rbd-fuse is killed, the kernel fails the pending requests,
// and the step returns ErrStalled. Mapper.Abort does the same on demand,
// for whatever else is blocked on a mapping (an app being undeployed).
//
// # Conformance
//
// mappertest.RunSuite holds the behaviour every backend must show. It runs
// against the file backend in every `go test` (as root), and against the
// fuse backend whenever the dev Ceph cluster is up.
package mapper
