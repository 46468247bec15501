package deploy

import (
	"io"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// The shared vocabulary (internal/spec) under the names the lifecycle has
// always used.
type (
	App        = spec.App
	Port       = spec.Port
	Readiness  = spec.Readiness
	Resources  = spec.Resources
	Duration   = spec.Duration
	Generation = spec.Generation
	Platform   = spec.Platform
	Mode       = spec.Mode
	Phase      = spec.Phase
)

// Modes, phases, policies, readiness kinds and errors of internal/spec.
const (
	EngineAuto     = spec.EngineAuto
	ModeAuto       = spec.ModeAuto
	ModeRestore    = spec.ModeRestore
	ModeBoot       = spec.ModeBoot
	ModeCheckpoint = spec.ModeCheckpoint
	ModeHelp       = spec.ModeHelp

	PhaseCreating     = spec.PhaseCreating
	PhaseBooting      = spec.PhaseBooting
	PhaseRestoring    = spec.PhaseRestoring
	PhaseRunning      = spec.PhaseRunning
	PhaseFailed       = spec.PhaseFailed
	PhaseRemoving     = spec.PhaseRemoving
	PhaseCheckpointed = spec.PhaseCheckpointed

	PolicyWait = spec.PolicyWait
	PolicyBoot = spec.PolicyBoot
	PolicyFail = spec.PolicyFail

	ReadyTCP    = spec.ReadyTCP
	ReadyHTTP   = spec.ReadyHTTP
	ReadyExec   = spec.ReadyExec
	ReadyOutput = spec.ReadyOutput

	MaxSpecSize           = spec.MaxSpecSize
	MaxPool               = spec.MaxPool
	DefaultReadyTimeout   = spec.DefaultReadyTimeout
	DefaultCheckpointSize = spec.DefaultCheckpointSize
)

// ParseApp reads an app spec (spec.ParseApp).
func ParseApp(r io.Reader) (App, error) { return spec.ParseApp(r) }

// HostPlatform reads this node's platform (spec.HostPlatform).
func HostPlatform() Platform { return spec.HostPlatform() }

// ValidateMode checks a deployment's mode (spec.ValidateMode).
func ValidateMode(m Mode) error { return spec.ValidateMode(m) }

// ValidatePolicies checks a deploy's mode and policies (spec.ValidatePolicies).
func ValidatePolicies(m Mode, ifBusy, ifNoEngine string) error {
	return spec.ValidatePolicies(m, ifBusy, ifNoEngine)
}
