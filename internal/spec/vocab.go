package spec

import (
	"errors"
	"fmt"
	"strings"
)

// Errors every layer branches on with errors.Is.
var (
	// ErrInvalidSpec: an app spec (or deploy request) failed validation;
	// nothing was created.
	ErrInvalidSpec = errors.New("invalid app spec")
	// ErrNotFound: no deployment with that ID on this node.
	ErrNotFound = errors.New("deployment not found")
	// ErrBusy: another deploy is producing the app's checkpoint.
	ErrBusy = errors.New("checkpoint being produced")
	// ErrExists: a deployment (or its instance) with that ID exists.
	ErrExists = errors.New("deployment exists")
)

// Mode is how a deployment runs its app (Deployment.Mode, Options.Mode,
// App.Mode).
type Mode string

// Deployment modes.
const (
	// ModeAuto boots or restores, whichever has been faster on the node:
	// the agent chooses (internal/adaptive) and asks Deploy for ModeBoot
	// or ModeRestore. Deploy itself restores in ModeAuto.
	ModeAuto Mode = "auto"
	// ModeRestore restores from the newest checkpoint generation,
	// producing the first one if there is none; as Deployment.Mode, the
	// instance was restored from a checkpoint generation.
	ModeRestore Mode = "restore"
	// ModeBoot: the app runs with no checkpoint engine, booted normally
	// (asked for, or Deployment.BootReason says why).
	ModeBoot Mode = "boot"
	// ModeCheckpoint asks a node for a new checkpoint generation of the
	// app (a refresh) and no instance.
	ModeCheckpoint Mode = "checkpoint"
)

// Policy is what Deploy does when it cannot restore at once
// (Options.IfBusy, Options.IfNoEngine; the agent's if_busy and
// if_no_engine).
type Policy string

// Policies.
const (
	// PolicyWait waits for the deploy that produces the checkpoint.
	PolicyWait Policy = "wait"
	// PolicyBoot boots the app normally, with no checkpoint engine.
	PolicyBoot Policy = "boot"
	// PolicyFail fails the deploy.
	PolicyFail Policy = "fail"
)

// DriverName names what runs a checkpoint engine's apps on a node (the
// agent's drivers).
type DriverName string

// Drivers.
const (
	// DriverContainer runs apps in the light container (the default).
	DriverContainer DriverName = "container"
	// DriverHost runs apps on the node, each in namespaces of its own, as
	// root without capabilities, in a cgroup of its own.
	DriverHost DriverName = "host"
)

// ModeHelp says which modes a deployment may ask for.
const ModeHelp = "use auto (boot or restore, whichever has been faster on the node), restore (from the checkpoint, producing it first if needed) or boot (without a checkpoint engine)"

// ValidateMode checks the mode a deployment asks for ("" is the default:
// the app's mode, else auto).
func ValidateMode(mode Mode) error {
	switch mode {
	case "", ModeAuto, ModeRestore, ModeBoot:
		return nil
	}
	return fmt.Errorf("mode %q: %s: %w", mode, ModeHelp, ErrInvalidSpec)
}

// ValidatePolicies checks Options.Mode, IfBusy and IfNoEngine values.
func ValidatePolicies(mode Mode, ifBusy, ifNoEngine Policy) error {
	var errs []error
	if err := ValidateMode(mode); err != nil {
		errs = append(errs, err)
	}
	switch ifBusy {
	case "", PolicyWait, PolicyBoot:
	default:
		errs = append(errs, fmt.Errorf("if_busy %q: use wait or boot: %w", ifBusy, ErrInvalidSpec))
	}
	switch ifNoEngine {
	case "", PolicyFail, PolicyBoot:
	default:
		errs = append(errs, fmt.Errorf("if_no_engine %q: use fail or boot: %w", ifNoEngine, ErrInvalidSpec))
	}
	return errors.Join(errs...)
}

// Phase is where a deployment is in its life (Deployment.Phase).
type Phase string

// Phases of a deployment. A deployment's status in the PoP's state takes
// StatusPhases; a node's own record of it also Restoring and Removing.
const (
	// PhasePending: placed on a node whose agent has not taken it yet.
	PhasePending  Phase = "Pending"
	PhaseCreating Phase = "Creating"
	// PhaseBooting: the app boots, to serve or to produce its checkpoint.
	PhaseBooting   Phase = "Booting"
	PhaseRestoring Phase = "Restoring"
	PhaseRunning   Phase = "Running"
	PhaseFailed    Phase = "Failed"
	PhaseRemoving  Phase = "Removing"
	// PhaseCheckpointed ends a checkpoint refresh: a new generation is
	// sealed and no instance runs.
	PhaseCheckpointed Phase = "Checkpointed"
	// PhaseSuspending: its instance is being checkpointed with its
	// file-system changes; PhaseSuspended: it is, and no instance runs
	// (Instance.Suspension says what it holds); PhaseResuming: it is
	// being restored from its suspension on a node.
	PhaseSuspending Phase = "Suspending"
	PhaseSuspended  Phase = "Suspended"
	PhaseResuming   Phase = "Resuming"
)

// StatusPhases are the phases a deployment's status in the PoP's state
// takes (docs/api.md lists them).
var StatusPhases = []Phase{PhasePending, PhaseCreating, PhaseBooting, PhaseRunning, PhaseFailed, PhaseCheckpointed,
	PhaseSuspending, PhaseSuspended, PhaseResuming}

// BootTimingPrefix starts the names of the timing phases of the boot and
// checkpoint that a deploy ran to produce its app's generation first
// ("boot.ready", "boot.checkpoint", ...).
const BootTimingPrefix = "boot."

// BootTiming names phase as one of the first boot's.
func BootTiming(phase string) string { return BootTimingPrefix + phase }

// CutBootTiming returns the phase a timing's name holds and whether it is
// one of the first boot's.
func CutBootTiming(name string) (string, bool) { return strings.CutPrefix(name, BootTimingPrefix) }
