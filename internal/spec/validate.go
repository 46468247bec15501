// Validation of an app spec: every problem at once, each naming its field and how to fix it.

package spec

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/engine"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// networkName is an App.Network: lowercase letters, digits and '-'.
var networkName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?$`)

// Validate reports every problem of the spec at once; each error names the
// field, says how to fix it and wraps ErrInvalidSpec.
func (a App) Validate() error {
	var p problems
	for _, f := range [][2]string{{"name", a.Name}, {"env", a.Env}} {
		if err := layering.ValidateName(f[0], f[1]); err != nil {
			p.fail(err)
		}
	}
	if a.Name == SpareApp {
		p.bad("name", "%q is the name of the nodes' spare slots: give the app another name", a.Name)
	}
	if a.Network != "" && !networkName.MatchString(a.Network) {
		p.bad("network", "%q: give 1 to 30 lowercase letters, digits or '-' (not first or last), e.g. shop", a.Network)
	}
	a.validateProcess(&p)
	a.validatePorts(&p)
	a.validateReady(p.bad)
	a.validateResources(&p)
	a.validateCheckpoint(&p)
	a.validateFrontend(&p)
	return p.err()
}

// validateFrontend checks the app's use of the front ends: an app made on
// demand needs a TCP port to be reached at, and is undeployed when idle,
// not suspended.
func (a App) validateFrontend(p *problems) {
	f := a.Frontend
	if idle := time.Duration(f.IdleAfter); idle != 0 && (idle < MinSuspendAfter || idle > MaxSuspendAfter) {
		p.bad("frontend.idle_after", "%s: use a duration between %s and %s, or leave it out (default %s)", idle, MinSuspendAfter, MaxSuspendAfter, DefaultIdleAfter)
	}
	if !f.OnDemand {
		if f.IdleAfter != 0 {
			p.bad("frontend.idle_after", "is set without frontend.on_demand: it undeploys instances made on demand only; set on_demand: true, or leave it out")
		}
		return
	}
	if !slices.ContainsFunc(a.Ports, func(p Port) bool { return p.Proto == "" || p.Proto == "tcp" }) {
		p.bad("frontend.on_demand", "the app has no tcp port to be reached at: add one under ports, or leave on_demand out")
	}
	if a.SuspendAfter != 0 {
		p.bad("frontend.on_demand", "cannot go with suspend_after: an instance made on demand is undeployed when idle (frontend.idle_after), with what it holds; keep suspend_after for apps whose instances keep a user's state")
	}
}

// problems collects what is wrong with a spec, each wrapping
// ErrInvalidSpec, so that one answer names every field to fix.
type problems struct{ errs []error }

// bad says what is wrong with field and how to fix it.
func (p *problems) bad(field, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: "+format+": %w", append(append([]any{field}, args...), ErrInvalidSpec)...))
}

// fail adds an error that names its field itself.
func (p *problems) fail(err error) {
	p.errs = append(p.errs, fmt.Errorf("%w: %w", err, ErrInvalidSpec))
}

func (p *problems) err() error { return errors.Join(p.errs...) }

// validateProcess checks what the app's process is started with: its
// command, post_restore, environment, workdir and user.
func (a App) validateProcess(p *problems) {
	if len(a.Command) == 0 || strings.TrimSpace(a.Command[0]) == "" {
		p.bad("command", "is empty: give the app's command line, e.g. [redis-server, --port, \"6379\"]")
	}
	checkArgs := func(field string, args []string) {
		if len(args) > maxArgs {
			p.bad(field, "has %d arguments: use at most %d", len(args), maxArgs)
		}
		for i, s := range args {
			if len(s) > maxArgLen || strings.ContainsRune(s, 0) {
				p.bad(fmt.Sprintf("%s[%d]", field, i), "is longer than %d bytes or holds a NUL byte", maxArgLen)
			}
		}
	}
	checkArgs("command", a.Command)
	if a.PostRestore != nil && (len(a.PostRestore) == 0 || strings.TrimSpace(a.PostRestore[0]) == "") {
		p.bad("post_restore", "is empty: give the command each restored instance runs, e.g. [sh, -c, \"redis-cli SET instance $FOGDEPLOY_INSTANCE\"], or leave it out")
	}
	checkArgs("post_restore", a.PostRestore)
	checkArgs("environment", a.Environment)
	for i, kv := range a.Environment {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsAny(k, " \t\n") {
			p.bad(fmt.Sprintf("environment[%d]", i), "%q is not KEY=VALUE", kv)
		}
	}
	if a.WorkDir != "" && !strings.HasPrefix(a.WorkDir, "/") {
		p.bad("workdir", "%q is not absolute: give a path inside the environment, e.g. /srv", a.WorkDir)
	}
	if a.User != "" {
		if err := validateUser(a.User); err != nil {
			p.bad("user", "%v", err)
		}
	}
}

// validatePorts checks the published ports: in range, tcp or udp, each
// once.
func (a App) validatePorts(p *problems) {
	seen := map[string]bool{}
	for i, pt := range a.Ports {
		f := fmt.Sprintf("ports[%d]", i)
		if pt.Port < 1 || pt.Port > 65535 {
			p.bad(f+".port", "%d is out of range: use 1-65535", pt.Port)
		}
		if pt.Proto != "" && pt.Proto != "tcp" && pt.Proto != "udp" {
			p.bad(f+".proto", "%q: use tcp or udp", pt.Proto)
		}
		key := fmt.Sprintf("%d/%s", pt.Port, pt.Proto)
		if seen[key] {
			p.bad(f, "%s is listed twice", key)
		}
		seen[key] = true
	}
}

// validateResources checks the CPU and memory limits.
func (a App) validateResources(p *problems) {
	if c := a.Resources.CPUs; c < 0 || c > 0 && c < MinCPUs || math.IsNaN(c) || math.IsInf(c, 0) || c > 1024 {
		p.bad("resources.cpus", "%v: give a number of CPUs between %v and 1024, or 0 for no limit", c, MinCPUs)
	}
	if a.Resources.Memory != "" {
		if n, err := layering.ParseSize("resources.memory", a.Resources.Memory); err != nil {
			p.fail(err)
		} else if n < 6<<20 {
			p.bad("resources.memory", "%s is below the 6M Docker accepts", a.Resources.Memory)
		}
	}
}

// validateCheckpoint checks how the app is checkpointed and deployed: its
// engine and what the engine allows, its stop signal and delay, its mode,
// pool and checkpoint size.
func (a App) validateCheckpoint(p *problems) {
	facts, known := engine.Lookup(a.Engine)
	if !known && a.Engine != "" && a.Engine != EngineAuto {
		p.bad("engine", "%q is not an engine: use %s or auto (each the node has, the fastest restore)", a.Engine, engine.List(engine.Names()))
	}
	if a.Lazy && known && !facts.LazyRestore {
		lazy := engine.NamesWith(func(f engine.Facts) bool { return f.LazyRestore })
		p.bad("lazy", "needs engine %s (or auto): only %s restore lazily", engine.List(lazy), engine.List(lazy))
	}
	switch a.Compression {
	case "", "none":
	case "gzip":
		if known && !facts.Compression {
			p.bad("compression", "gzip is only available with the %s engine", engine.List(engine.NamesWith(func(f engine.Facts) bool { return f.Compression })))
		}
	default:
		p.bad("compression", "%q: use none or gzip", a.Compression)
	}
	if a.StopSignal != "" && !slices.Contains(stopSignals, a.StopSignal) {
		p.bad("stop_signal", "%q: use one of %s", a.StopSignal, strings.Join(stopSignals, ", "))
	}
	if a.CheckpointDelay < 0 || time.Duration(a.CheckpointDelay) > time.Minute {
		p.bad("checkpoint_delay", "%s: use a duration between 0 and 1m", time.Duration(a.CheckpointDelay))
	}
	if after := time.Duration(a.SuspendAfter); after != 0 && (after < MinSuspendAfter || after > MaxSuspendAfter) {
		p.bad("suspend_after", "%s: use a duration between %s and %s, or leave it out", after, MinSuspendAfter, MaxSuspendAfter)
	}
	if err := ValidateMode(a.Mode); err != nil {
		p.bad("mode", "%q: %s", a.Mode, ModeHelp)
	}
	if a.Pool != nil && (*a.Pool < 0 || *a.Pool > MaxPool) {
		p.bad("pool", "%d: give the number of idle slots each node keeps, 0 to %d (0: no pool)", *a.Pool, MaxPool)
	}
	if a.CheckpointSize != "" {
		if n, err := layering.ParseSize("checkpoint_size", a.CheckpointSize); err != nil {
			p.fail(err)
		} else if n < 64<<20 {
			p.bad("checkpoint_size", "%s is too small: use at least 64M", a.CheckpointSize)
		}
	}
}

func (a App) validateReady(bad func(field, format string, args ...any)) {
	r := a.Ready
	port := func() {
		if r.Port < 1 || r.Port > 65535 {
			bad("ready.port", "%d is out of range: give the app port to probe (1-65535)", r.Port)
			return
		}
		for _, p := range a.Ports {
			if p.Port == r.Port && (p.Proto == "" || p.Proto == "tcp") {
				return
			}
		}
		bad("ready.port", "%d is not one of the app's tcp ports: add it under ports", r.Port)
	}
	switch r.Kind {
	case ReadyTCP:
		port()
		if r.Expect != "" && r.Send == "" {
			bad("ready.send", "is empty but ready.expect is set: give the request to send")
		}
	case ReadyHTTP:
		port()
		if !strings.HasPrefix(r.Path, "/") {
			bad("ready.path", "%q must start with '/'", r.Path)
		}
		if r.Status != 0 && (r.Status < 100 || r.Status > 599) {
			bad("ready.status", "%d is not an HTTP status", r.Status)
		}
	case ReadyExec:
		if len(r.Command) == 0 || r.Command[0] == "" {
			bad("ready.command", "is empty: give a command that exits 0 once the app is ready")
		}
	case ReadyOutput:
		if strings.TrimSpace(r.Phrase) == "" {
			bad("ready.phrase", "is empty: give the phrase the app prints once it is ready")
		}
	case "":
		bad("ready.kind", "is empty: say how to tell the app is ready: tcp, http, exec or output")
	default:
		bad("ready.kind", "%q: use tcp, http, exec or output", r.Kind)
	}
	if r.Timeout < 0 || time.Duration(r.Timeout) > time.Hour {
		bad("ready.timeout", "%s: use a duration between 1s and 1h", time.Duration(r.Timeout))
	}
}

// stopSignals are the signals an app may be stopped with: those the DMTCP
// container's entrypoint forwards to the app.
var stopSignals = []string{"SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP"}

// validateUser checks a user spec: NAME, UID, NAME:GROUP or UID:GID, not
// root (an app without a user runs as root already).
func validateUser(u string) error {
	name, group, hasGroup := strings.Cut(u, ":")
	if !userPart.MatchString(name) || (hasGroup && !userPart.MatchString(group)) {
		return fmt.Errorf("%q: give NAME, UID, NAME:GROUP or UID:GID of the environment's /etc/passwd and /etc/group, e.g. postgres", u)
	}
	if name == "root" || strings.Trim(name, "0") == "" {
		return fmt.Errorf("%q is root: leave user out to run the app as root", u)
	}
	return nil
}

// userPart is a user or group name (as useradd accepts it) or a number.
var userPart = regexp.MustCompile(`^(?:[a-z_][a-z0-9_.-]{0,30}[$]?|[0-9]{1,10})$`)

// Bounds of App.SuspendAfter.
const (
	MinSuspendAfter = 5 * time.Second
	MaxSuspendAfter = 30 * 24 * time.Hour
)
