// Command entrypoint is PID 1 of fogdeploy's DMTCP container (paper §IV-A).
//
// It turns the environment clone bind-mounted at /fog/root into the app's
// root, starts a DMTCP coordinator on 127.0.0.1 inside the container, and
// then either launches the app under DMTCP (launch) or restores it from the
// newest checkpoint generation under /fog/ckpt (restart). It supervises the
// app as PID 1 and checkpoints it on SIGUSR1 or when a request file appears.
// See dmtcp-image/README.md for the container contract.
package main

import (
	"os"
	"runtime"
)

// init keeps the main thread for the main goroutine alone. Under CRIU the
// engine enters the app's mount and PID namespaces on locked threads that
// it never gives back; had one of them been the main thread, /proc/1/ns
// would name the app's namespaces, and `docker exec`, which joins those of
// the container's PID 1, would start in the app's mount namespace, whose
// /proc belongs to another PID namespace ("open /proc/self/fd: no such
// file or directory").
func init() { runtime.LockOSThread() }

func main() { os.Exit(Main(os.Args[1:])) }
