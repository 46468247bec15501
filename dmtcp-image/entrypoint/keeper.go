package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	goruntime "runtime"
	"strings"
	"syscall"

	"github.com/fogdeploy/fogdeploy/internal/seccomp"
)

// keep is the "keep" mode: the live parent of the app.
//
// Why a separate process: DMTCP records the app's parent PID in the image,
// and an app whose parent was PID 1 is restored as an orphan — dmtcp_restart
// double-forks and exits at once. Under the keeper the app's parent is never
// PID 1, so dmtcp_restart stays in the foreground and becomes the app
// (it execs mtcp_restart), and the keeper's exit status is the app's.
//
// The keeper chroots itself into the root, drops every capability from all
// its sets (the app never holds one), starts
// argv with the environment it was given, forwards SIGTERM, SIGINT, SIGHUP,
// SIGQUIT and SIGUSR2, and exits with the app's status.
//
// With -user, the app runs as that user of the root (resolved in the root's
// /etc/passwd and /etc/group, with HOME from passwd): the keeper removes
// CAP_SETUID and CAP_SETGID from the bounding set, starts the app with the
// user's credentials (the switch away from uid 0 clears the app's
// capabilities), takes the user's uid as its real and effective uid (to
// forward signals without CAP_KILL; the saved uid 0 lets PID 1 signal it),
// and drops both from its own sets. Without -user they are dropped before
// the app starts, like the others.
//
// With -init, the keeper is the init of the app's own PID and mount
// namespaces (see appns.go): it mounts their /proc in the root and runs a
// second keeper, without -init, as its only child. With -join, a command
// (docker exec) runs in the namespaces of the container's app, as the app
// would see them.
//
//	entrypoint keep [-init|-join] [-user USER] ROOT WORKDIR ARGV...
func keep(args []string) int {
	var user string
	var init, join bool
	for len(args) > 0 {
		switch {
		case args[0] == "-init":
			init, args = true, args[1:]
			continue
		case args[0] == "-join":
			join, args = true, args[1:]
			continue
		case args[0] == "-user" && len(args) >= 2:
			user, args = args[1], args[2:]
			continue
		}
		break
	}
	if len(args) < 3 || (init && join) {
		fmt.Fprintln(os.Stderr, "entrypoint keep: want [-init|-join] [-user USER] ROOT WORKDIR ARGV...")
		return exitUsage
	}
	root, workdir, argv := args[0], args[1], args[2:]
	if init {
		return initApp(user, root, workdir, argv)
	}
	var acct account
	if user != "" {
		var err error
		if acct, err = lookupUser(root, user); err != nil {
			fmt.Fprintf(os.Stderr, "entrypoint keep: %v\n", err)
			return exitSetup
		}
	}
	// Every step below runs on this thread: with -join it alone has
	// entered the app's namespaces, and the app is forked from it.
	goruntime.LockOSThread()
	if err := enterRoot(root, join); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep: %v\n", err)
		return exitSetup
	}
	// Every capability goes (a CRIU container has more than the DMTCP
	// container's), CAP_SETPCAP last; with -user, CAP_SETUID and
	// CAP_SETGID stay until the app has started.
	if user != "" {
		if err := dropBounding(capSetuid, capSetgid); err != nil {
			fmt.Fprintf(os.Stderr, "entrypoint keep: %v: the app is not started\n", err)
			return exitSetup
		}
	}
	if err := dropCaps(allCapsBut(user != "")...); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep: %v: the app is not started with capabilities it must not have\n", err)
		return exitSetup
	}
	// The app, forked from this thread, inherits its system-call filter
	// (internal/seccomp): a CRIU container runs without Docker's.
	if err := seccomp.InstallThread(); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep: %v\n", err)
		return exitSetup
	}
	return keepApp(argv, workdir, user, acct)
}

// enterRoot joins the app's namespaces and root (join), or chroots into
// root, and goes to its top.
func enterRoot(root string, join bool) error {
	joined := false
	if join {
		var err error
		if joined, err = joinApp(); err != nil {
			return err
		}
	}
	if root != "/" && !joined {
		if err := syscall.Chroot(root); err != nil {
			return fmt.Errorf("chroot %s: %w (the container needs CAP_SYS_CHROOT)", root, err)
		}
	}
	// The keeper itself stays at the root: the working directory may be
	// one that only the app's user can enter (the container has no
	// CAP_DAC_OVERRIDE). The app changes into it after its credentials
	// are set (cmd.Dir).
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("chdir / inside the root: %w", err)
	}
	return nil
}

// keepApp starts argv in workdir (as user, whose last capabilities then
// go), forwards termination signals and SIGUSR2 to it, and returns its
// exit status.
func keepApp(argv []string, workdir, user string, acct account) int {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR2)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Dir = workdir
	if user != "" {
		shareOutput(os.Stdout, os.Stderr)
		cmd.Env = withHome(os.Environ(), acct.home)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: acct.uid, Gid: acct.gid, Groups: acct.groups}}
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint keep: start %s in %s inside the root: %v\n", argv[0], workdir, err)
		return exitSetup
	}
	if user != "" {
		// Signals to the app need a matching uid (there is no CAP_KILL):
		// real and effective uid become the app's, the saved uid stays 0
		// so that PID 1 can still signal the keeper.
		if err := syscall.Setresuid(int(acct.uid), int(acct.uid), 0); err != nil {
			fmt.Fprintf(os.Stderr, "entrypoint keep: setresuid: %v: signals could not reach the app; it is ended\n", err)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return exitSetup
		}
		if err := dropCaps(capSetuid, capSetgid); err != nil {
			// The app's parent must not keep the user switch's
			// capabilities beside it.
			fmt.Fprintf(os.Stderr, "entrypoint keep: %v: the app is ended\n", err)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return exitSetup
		}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return exitStatus(ee.Sys().(syscall.WaitStatus))
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "entrypoint keep: %v\n", err)
				return exitSetup
			}
			return exitOK
		}
	}
}

// noCaps is the "nocaps" mode: drop every capability and exec argv. The
// coordinator and dmtcp_command run through it, so that only PID 1 holds
// capabilities in the container (it needs CAP_SYS_CHROOT and CAP_SETPCAP to
// start the keeper), and so does a CRIU container's app (started inside
// its root as /proc/self/exe, this binary, with -keep), whose image then
// records only the capabilities it kept. Descriptors are inherited as they are (fd 821). An argv[0]
// without a slash is looked up in PATH.
//
// With -keep, the listed capabilities (names of appCaps, comma-separated)
// stay: a CRIU container's app keeps the set of appCapNames. With -user
// instead, it takes that user of its root (as keep -user does) and keeps
// no capability: a CRIU app that runs as a user.
//
//	entrypoint nocaps [-keep CAP,...|-user USER] ARGV...
//
// A capability that cannot be dropped ends it before the exec.
func noCaps(args []string) int {
	var kept []int
	if len(args) >= 2 && args[0] == "-keep" {
		for _, name := range strings.Split(args[1], ",") {
			c, ok := appCaps[strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(name)), "CAP_")]
			if !ok {
				fmt.Fprintf(os.Stderr, "entrypoint nocaps: -keep %q: an app may keep only %s\n", name, appCapNames)
				return exitUsage
			}
			kept = append(kept, c)
		}
		args = args[2:]
	}
	var user string
	if len(args) >= 2 && args[0] == "-user" && len(kept) == 0 {
		user, args = args[1], args[2:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "entrypoint nocaps: want [-keep CAP,...|-user USER] ARGV...")
		return exitUsage
	}
	env := os.Environ()
	if user != "" {
		acct, err := becomeUser(user)
		if err != nil {
			fmt.Fprintf(os.Stderr, "entrypoint nocaps: %v\n", err)
			return exitSetup
		}
		env = withHome(env, acct.home)
	} else if err := dropCaps(capsExcept(kept...)...); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint nocaps: %v: %s is not run with capabilities it must not have\n", err, args[0])
		return exitSetup
	}
	path := args[0]
	if !strings.Contains(path, "/") {
		// The app of a CRIU container is started by name, in the root's PATH.
		p, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "entrypoint nocaps: %v\n", err)
			return exitSetup
		}
		path = p
	}
	// The system-call filter of an app without capabilities
	// (internal/seccomp), on this thread, which the exec keeps alone: a
	// CRIU container runs without Docker's profile, which criu could not
	// suspend. Docker's no-new-privileges lets it be installed.
	goruntime.LockOSThread()
	if err := seccomp.InstallThread(); err != nil {
		fmt.Fprintf(os.Stderr, "entrypoint nocaps: %v\n", err)
		return exitSetup
	}
	err := syscall.Exec(path, args, env)
	fmt.Fprintf(os.Stderr, "entrypoint nocaps: exec %s: %v\n", args[0], err)
	return exitSetup
}

// allCapsBut returns every capability in the order dropCaps needs
// (CAP_SETPCAP last); with keepIDs, CAP_SETUID and CAP_SETGID are left out.
func allCapsBut(keepIDs bool) []int {
	if keepIDs {
		return capsExcept(capSetuid, capSetgid)
	}
	return capsExcept()
}
