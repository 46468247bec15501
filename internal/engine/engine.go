// Package engine checkpoints a running app and restores it: the "DMTCP
// container" and "first-deploy checkpoint / restore" steps of fogdeploy.
//
// An Engine has two implementations, DMTCP (the default, NewDMTCP) and CRIU
// (NewCRIU), and one behaviour suite, enginetest.RunSuite. The lifecycle of
// an app is the same for both:
//
// First deploy: boot the app once, wait until it is ready, write an image.
//
//	e := engine.NewDMTCP(engine.Config{Prefix: "/opt/dmtcp", Logger: log})
//	p, err := e.Launch(ctx, engine.LaunchSpec{Argv: argv, Root: envMount, NetNS: true})
//	_, err = engine.WaitReady(ctx, engine.TCPProbe{Addr: "127.0.0.1:6379", Dial: engine.NetNSDialer(p.Pid())}, engine.ReadyOptions{Process: p})
//	img, err := e.Checkpoint(ctx, p, ckptMount) // an empty directory; p is gone afterwards
//
// Restore: later, on any node that mounts the same environment and image.
//
//	img, err := engine.ReadImage(ckptMount)
//	q, err := e.Restore(ctx, img, engine.RestoreSpec{Root: envMount, NetNS: true})
//	code, err := q.Wait(ctx) // q is supervised: Wait returns the app's exit status
//
// A restored process can be checkpointed again into a new empty directory
// (the next generation) and restored from there.
//
// Readiness is decided by a Probe (TCPProbe, HTTPProbe, ExecProbe,
// OutputProbe) run by WaitReady; put a LogTail behind the app's output so
// that a timeout error shows the app's last lines.
//
// Every Process runs in private namespaces owned by its engine: a mount
// namespace (for the chroot into Root and for attaching the checkpoint
// directory), and with NetNS a network namespace with only lo up, so that a
// restored server never fights a TIME_WAIT port and any number of restores
// of one image can run side by side. Nothing is mounted on the host, and
// everything an engine started is gone once Wait has returned. The engines
// need root (CAP_SYS_ADMIN).
package engine

import (
	"context"
	"io"
	"os"
	"time"
)

// Name names a checkpoint engine.
type Name string

// Engine names.
const (
	NameDMTCP Name = "dmtcp"
	NameCRIU  Name = "criu"
)

// Engine starts apps under a checkpoint engine, checkpoints them and
// restores them. Implementations are safe for concurrent use.
type Engine interface {
	// Name is NameDMTCP or NameCRIU.
	Name() Name
	// Check finds the engine's binaries and reports their version. It
	// returns an error wrapping ErrUnavailable, with the reason and a hint,
	// when the engine cannot run here.
	Check(ctx context.Context) (Info, error)
	// Launch starts the app under the engine and returns once it runs
	// (DMTCP: once it has joined its private coordinator).
	Launch(ctx context.Context, spec LaunchSpec) (Process, error)
	// Checkpoint writes an image of p into dir, which must be empty or
	// absent (else ErrInvalid, and p is untouched), waits until the image is
	// complete and leaves p stopped: p.Wait returns at once afterwards. A
	// manifest (ManifestName) is written last. A failed checkpoint leaves
	// dir empty; CRIU resumes the app, DMTCP (which may have suspended it
	// mid-way) kills it.
	Checkpoint(ctx context.Context, p Process, dir string) (Image, error)
	// Restore restarts the app from img and returns once the restored
	// process runs.
	Restore(ctx context.Context, img Image, spec RestoreSpec) (Process, error)
}

// Process is an app started by Launch or Restore. The engine supervises it:
// it stays the parent of the app, so Wait returns the app's exit status.
type Process interface {
	// Pid is the app's PID as seen on the host.
	Pid() int
	// Wait blocks until the app has exited and everything the engine started
	// for it (coordinator, namespaces, temporary files) is gone, or until
	// ctx is done. An app killed by signal N reports 128+N. Wait may be
	// called any number of times, concurrently.
	Wait(ctx context.Context) (exitCode int, err error)
	// Signal sends sig to the app.
	Signal(sig os.Signal) error
	// Stop sends SIGTERM, waits up to the engine's StopTimeout, then kills
	// the app and its helpers. It returns once Wait would return.
	Stop(ctx context.Context) error
	// Timings reports how long the phases of this process took.
	Timings() Timings
}

// Timings are measured phase durations of a Process.
type Timings struct {
	// Launch is the time from Launch's call until the app ran under the
	// engine (zero for a restored process).
	Launch time.Duration
	// Restore is the time from Restore's call until the restored process ran
	// (zero for a launched process).
	Restore time.Duration
}

// LaunchSpec describes an app to start.
type LaunchSpec struct {
	// Argv is the command line; Argv[0] is looked up in PATH (of Env)
	// inside Root.
	Argv []string
	// Env is the environment. nil means os.Environ() when Root is "", and
	// only PATH and HOME inside a Root. The engine adds its own variables
	// (DMTCP: LC_ALL=C, coordinator address).
	Env []string
	// Dir is the working directory inside Root; "" means "/". It must exist
	// again at restore time.
	Dir string
	// Root, when not "", is a directory (the mounted environment clone) to
	// chroot into. Inside a private mount namespace it gets /proc, /dev
	// (bound from the host), a fresh tmpfs on /tmp and, for DMTCP, the
	// engine prefix bound read-only at the same path.
	Root string
	// Stdout and Stderr receive the app's output; nil discards it. They may
	// be the same writer.
	Stdout, Stderr io.Writer
	// NetNS runs the app in a fresh network namespace with only lo up.
	NetNS bool
	// Compression of the image: "" or "none", or "gzip" (DMTCP only).
	Compression string
}

// RestoreSpec describes where to restore an image.
type RestoreSpec struct {
	// Root is the directory to chroot into, as in LaunchSpec. It must hold
	// the same files at the same paths as at checkpoint time. CRIU also
	// needs it at the same host path; a different Root is bound over that
	// path inside the private mount namespace.
	Root string
	// Stdout and Stderr receive the restored app's output.
	Stdout, Stderr io.Writer
	// NetNS restores into a fresh network namespace with only lo up.
	NetNS bool
	// Lazy restores the process without its memory pages, which a page
	// server then serves from the image on first touch (and in the
	// background until all are in): the app runs before the whole image is
	// read. Only CRIU restores lazily (userfaultfd, `criu lazy-pages`);
	// other engines refuse it (ErrInvalid).
	Lazy bool
}

// Info describes an installed engine.
type Info struct {
	Name    Name
	Version string
	// Prefix is the installation prefix the binaries were found under.
	Prefix string
	// Binaries maps each binary the engine uses to its path.
	Binaries map[string]string
}

// Image is a checkpoint image on disk. Checkpoint returns it and writes it
// as a manifest into Dir; ReadImage reads it back.
type Image struct {
	// Engine is the name of the engine that wrote the image.
	Engine Name `json:"engine"`
	// Version is the engine's version.
	Version string `json:"version"`
	// Dir is the directory holding the image (not stored in the manifest).
	Dir string `json:"-"`
	// Files are the engine's image files, relative to Dir.
	Files []string `json:"files"`
	// Bytes is the total size of the directory's files.
	Bytes int64 `json:"bytes"`
	// Compression is "" or "gzip".
	Compression string `json:"compression,omitempty"`
	// Root is the Root the app ran in ("" for the host).
	Root string `json:"root,omitempty"`
	// Argv is the command line the app was first launched with.
	Argv []string `json:"argv,omitempty"`
	// Created is when the image was complete.
	Created time.Time `json:"created"`
	// Write is how long writing the image took: from the checkpoint request
	// until the image was complete.
	Write time.Duration `json:"write_ns"`
	// Generation counts checkpoints: 1 for a launched app, n+1 for an app
	// restored from generation n.
	Generation int `json:"generation"`
	// Stdio maps the app's fd numbers to the pipes they were at checkpoint
	// time ("pipe:[1234]"); CRIU reconnects them with --inherit-fd.
	Stdio map[int]string `json:"stdio,omitempty"`
	// Orphan records that the app's parent was PID 1 at checkpoint time;
	// dmtcp_restart then forks and the engine adopts the app as a child
	// subreaper.
	Orphan bool `json:"orphan,omitempty"`
}
