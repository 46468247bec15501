// Command entrypoint is PID 1 of fogdeploy's DMTCP container (paper §IV-A).
//
// It turns the environment clone bind-mounted at /fog/root into the app's
// root, starts a DMTCP coordinator on 127.0.0.1 inside the container, and
// then either launches the app under DMTCP (launch) or restores it from the
// newest checkpoint generation under /fog/ckpt (restart). It supervises the
// app as PID 1 and checkpoints it on SIGUSR1 or when a request file appears.
// See dmtcp-image/README.md for the container contract.
package main

import "os"

func main() { os.Exit(Main(os.Args[1:])) }
