// Package layering stores container environments as chains of Ceph RBD
// snapshots and copy-on-write clones (paper §IV-B, Fig. 3–5).
//
// # Vocabulary
//
// An image is an RBD image that holds an ext4 filesystem. A snapshot is a
// protected, read-only point in time of an image ("image@snap"); children are
// cloned from it. A clone is a copy-on-write child image of a snapshot: it
// shares every block with its parent until it writes one. An environment is a
// named, protected snapshot whose filesystem is a container's root
// filesystem; its chain is the list of snapshots it was cloned from.
//
// # Importing a root filesystem
//
//  1. A local sparse file is filled with `mkfs.ext4 -d DIR` (from a
//     directory, a tar stream, or a Docker image exported through the moby
//     client).
//  2. Store.Create makes an image of the requested size and Store.Write copies
//     the non-zero blocks of that file into it.
//  3. Store.Snapshot creates and protects the snapshot "sealed".
//  4. The Catalog tags the environment name with the snapshot.
//
// # Building a layer (one step of a build file)
//
//  1. Store.Clone clones the parent snapshot into an image named after the
//     step's cache key (same parent + same step = same name).
//  2. The clone is mapped and mounted, the step runs (COPY, or RUN with the
//     clone as the root of namespaces of its own: sandbox.go).
//  3. The clone is unmounted and unmapped, then snapshotted and protected.
//
// A step whose image already has its "sealed" snapshot is reused from cache.
//
// # Running a container (see the deploy packages)
//
// The environment snapshot is cloned, mapped, mounted and handed to the
// container as its root; the clone is removed when the container goes.
package layering
