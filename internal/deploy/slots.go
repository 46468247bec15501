// Slots: what an instance lives in on a node (its clones, mapped and mounted, its instance created
// and waiting), journaled in StateDir/slots/<id>.json. Resources are named after the slot; a
// deployment binds a slot (stages.go) and owns its resources from then on.

package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/journal"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// Pool is the node's slots: each one an instance's place made ahead of
// its deployment (its images, mappings, mounts and container), journaled
// in StateDir/slots. A warm pool's slots wait, filled with a generation of
// their app or restored ahead, for a deploy to claim them; spare slots
// wait for any app's restore; prepared slots for a suspended instance's
// resume. Pool owns the slots' records and which of them are idle,
// claimed, starting or being released.
type Pool struct {
	*node
	drv    *Drivers
	envs   *EnvCopies
	ckpts  *Checkpoints
	recs   *Records
	stages *Stages

	// slots are the slots' records (internal/journal).
	slots journal.Journal[Slot]
	// slotMu guards idle and claimed, and the phase changes of the slots
	// in them.
	slotMu sync.Mutex
	// idle indexes this process's idle pool slots (pool.go): what claims
	// pick from, and the generation each was filled with, for a pool
	// hit's lookup (pooledGen).
	idle map[string]idleSlot
	// claimed are the pool slots that a deploy claimed and has not bound
	// or released yet, by slot ID: the deployment's ID and the slot's
	// entry in idle. A claim is kept here only (claim, in slots.go).
	claimed map[string]claimedSlot
	// releasing are the slots a DropPool or ReleaseSpares releases now. A
	// slot whose record says Releasing and that is not here is one whose
	// release failed: the next DropPool of its app (a spare: the next
	// ReleaseSpares) retries it.
	releasing map[string]bool
	// starting are the pool slots being restored ahead (ahead.go), that
	// a deploy finding no idle slot waits for.
	starting map[string]*startingSlot
	// aheadPause holds StartAhead before its restore (tests).
	aheadPause time.Duration
	// spares indexes this process's idle spare slots (spare.go), under
	// slotMu, as idle does the pool's.
	spares map[string]Slot
}

// Pool returns the node's slots.
func (d *Deployer) Pool() *Pool { return d.pool }

// ErrNoSlot: the warm pool has no idle slot for the app's generation.
var ErrNoSlot = errors.New("no idle slot")

// SlotPhase is where a slot is in its life.
type SlotPhase string

// Slot phases.
const (
	// SlotProvisioning: its images, mappings and instance are being made.
	SlotProvisioning SlotPhase = "Provisioning"
	// SlotIdle: provisioned, its instance waiting for an order.
	SlotIdle SlotPhase = "Idle"
	// SlotClaimed: a deployment (Slot.Deployment) is starting it.
	SlotClaimed SlotPhase = "Claimed"
)

// Owned is what an instance owns on this node: its RBD images, their
// mappings, the directory of its mount points, and its instance.
type Owned struct {
	// Images are the RBD images it owns.
	Images []string `json:"images,omitempty"`
	// Mappings are the mapper IDs of its mapped images.
	Mappings []string `json:"mappings,omitempty"`
	// Dir holds its mount points and control directory.
	Dir    string          `json:"dir,omitempty"`
	Handle *drivers.Handle `json:"handle,omitempty"`
	// Lower is the ID of the node's read-only copy of the generation's
	// environment that its root reads from (lower.go); "" when its root
	// is its own clone.
	Lower string `json:"lower,omitempty"`
	// Seed is the identity seed of its instance (identify).
	Seed string `json:"seed,omitempty"`
}

// Slot is the record of one slot on this node.
type Slot struct {
	ID   string `json:"id"`
	App  string `json:"app"`
	Node string `json:"node,omitempty"`
	// Gen is the generation it restores (RunRestart) or writes
	// (RunLaunch); 0 for RunBoot.
	Gen   int             `json:"gen"`
	Mode  drivers.RunMode `json:"mode"`
	Phase SlotPhase       `json:"phase"`
	// Pool is set on a warm pool's slot, provisioned ahead of any request
	// and at background priority.
	Pool bool `json:"pool,omitempty"`
	// Deployment is the deployment the slot is provisioned for or claimed
	// by ("" for an idle pool slot).
	Deployment string `json:"deployment,omitempty"`
	Owned
	// Ahead: its app was restored before any request and waits running
	// at the background CPU weight (StartAhead).
	Ahead bool `json:"ahead,omitempty"`
	// KeepSeed: its instance keeps Seed (a resume); otherwise each
	// instance draws its own.
	KeepSeed bool `json:"keep_seed,omitempty"`
	// Engine is the engine of a slot prepared for a resume (SlotPrepared).
	Engine engine.Name `json:"engine,omitempty"`
	// Spare is set on a spare slot (spare.go), made for no app: App and
	// Gen are those of the restore that took it, once one did.
	Spare *SpareSlot `json:"spare,omitempty"`
	// Fetched: provisioning brought the generation's checkpoint to the
	// node (it held no copy).
	Fetched bool              `json:"fetched,omitempty"`
	Ports   map[string]string `json:"ports,omitempty"`
	Timings layering.Timings  `json:"timings"`
	Created time.Time         `json:"created"`
}

// NewSlotID returns a fresh slot ID for app: <app>-s<8 hex digits>, so
// that an app's clones share the prefix fdi-<app>-.
func NewSlotID(app string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	if len(app) > spec.MaxIDLen-10 {
		app = strings.TrimRight(app[:spec.MaxIDLen-10], "-._")
	}
	return app + "-s" + hex.EncodeToString(b)
}

// newSlot creates the record of a slot of app in mode, owning images
// named after it (or the given ones) before any is made.
func (p *Pool) newSlot(app string, gen int, mode drivers.RunMode, pool bool, dep string, images []string) (*Slot, error) {
	id := NewSlotID(app)
	if images == nil {
		images = []string{catalog.InstancePrefix + id + "-env"}
		// A restore reads the node's copy of its checkpoint (cache.go).
		if mode == drivers.RunLaunch {
			images = append(images, catalog.InstancePrefix+id+"-ckpt")
		}
	}
	maps := []string{id + "-env"}
	if len(images) > 1 {
		maps = append(maps, id+"-ckpt")
	}
	s := &Slot{ID: id, App: app, Node: p.cfg.Node, Gen: gen, Mode: mode, Phase: SlotProvisioning, Pool: pool, Deployment: dep,
		Owned:   Owned{Images: images, Mappings: maps, Dir: filepath.Join(p.cfg.StateDir, "instances", id)},
		Created: time.Now().UTC()}
	// Named before it is made, so that TrimLowers sees it in use.
	if mode == drivers.RunRestart && p.cfg.EnvRead == EnvShared {
		s.Lower = lowerID(app, gen)
	}
	if err := p.slots.Create(id, s, true); err != nil {
		return nil, err
	}
	return s, nil
}

// Slots returns this node's slot records: the warm pool's idle slots and
// those being provisioned or started. A slot claimed by a deploy under
// way is SlotClaimed, with its deployment, though its record says Idle
// (claim).
func (p *Pool) Slots() ([]Slot, error) {
	all, err := p.slots.List()
	if err != nil {
		return nil, err
	}
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	for i := range all {
		p.withClaim(&all[i])
	}
	return all, nil
}

// LoadSlot reads a slot's record (with its claim, as Slots).
func (p *Pool) LoadSlot(id string) (Slot, error) {
	if err := spec.ValidateID(id); err != nil {
		return Slot{}, err
	}
	s, err := p.slots.Load(id)
	if err != nil {
		return Slot{}, err
	}
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	p.withClaim(&s)
	return s, nil
}

// withClaim marks s claimed if a deploy of this process claimed it. The
// caller holds slotMu.
func (p *Pool) withClaim(s *Slot) {
	if c, ok := p.claimed[s.ID]; ok && s.Phase == SlotIdle {
		s.Phase, s.Deployment = SlotClaimed, c.dep
	}
}

// ReleaseSlot removes a slot that no deployment has bound: its instance,
// mounts, mappings, images and record. It is idempotent.
func (p *Pool) ReleaseSlot(ctx context.Context, id string) error {
	p.forget(id)
	s, err := p.slots.Load(id)
	if errors.Is(err, ErrNoSlot) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := p.stages.releaseResources(ctx, id, s.Owned, id); err != nil {
		return err
	}
	if err := p.slots.Unreserve(id); err != nil {
		return err
	}
	return p.slots.Remove(id)
}

// claim takes the oldest idle pool slot of app's generation gen for
// deployment dep, one restored ahead first, or returns ErrNoSlot. It picks
// from the index of idle slots (offer), which holds each slot's record as
// saved, and writes nothing: the slot's record still says Idle, and the
// claim lives in this process only (Deployer.claimed) until the deploy
// binds the slot, when the deployment's record takes its resources, or
// releases it on error. A claim lost with the process leaves an idle
// slot's record, which recovery releases.
func (p *Pool) claim(app string, gen int, dep string) (*Slot, error) {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	var best *Slot
	for _, c := range p.idle {
		s := &c.slot
		if s.App == app && s.Gen == gen && s.Pool && s.Phase == SlotIdle && s.Handle != nil && s.Mode == drivers.RunRestart &&
			(best == nil || s.Ahead && !best.Ahead || s.Ahead == best.Ahead && s.Created.Before(best.Created)) {
			best = s
		}
	}
	if best == nil {
		return nil, fmt.Errorf("app %s generation %d: %w", app, gen, ErrNoSlot)
	}
	p.claimed[best.ID] = claimedSlot{dep: dep, idle: p.idle[best.ID]}
	p.withdraw(best.ID)
	s := *best
	h := *s.Handle
	s.Handle = &h
	s.Phase, s.Deployment = SlotClaimed, dep
	return &s, nil
}

// claimedSlot is what claim keeps of a claimed slot: the deployment that
// took it, and its entry in the index, should the deploy give it back
// untouched (unclaim).
type claimedSlot struct {
	dep  string
	idle idleSlot
}

// unclaim gives slot id back to the index as it was claimed: the deploy
// that claimed it ended before any stage touched it (cancelled while it
// waited for its turn).
func (p *Pool) unclaim(id string) {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	if c, ok := p.claimed[id]; ok {
		delete(p.claimed, id)
		p.idle[id] = c.idle
	}
}

// RecoverSlots, at start, finishes what a previous run left in the slot
// records: a slot whose resources a deployment's record owns (a bind cut
// short) loses its record only; every other slot, idle ones included, is
// released (the warm pool provisions anew). It returns the released IDs.
func (p *Pool) RecoverSlots(ctx context.Context) ([]string, error) {
	slots, err := p.slots.List()
	if err != nil {
		return nil, err
	}
	recs, err := p.recs.List()
	if err != nil {
		return nil, err
	}
	bound := map[string]bool{}
	for _, r := range recs {
		if r.Slot != "" && len(r.Images) > 0 {
			bound[r.Slot] = true
		}
	}
	var done []string
	var errs []error
	for _, s := range slots {
		if bound[s.ID] {
			_ = p.slots.Remove(s.ID)
			continue
		}
		if err := p.ReleaseSlot(ctx, s.ID); err != nil {
			errs = append(errs, fmt.Errorf("slot %s: %w", s.ID, err))
			continue
		}
		done = append(done, s.ID)
	}
	if err := p.slots.DropSpares(); err != nil {
		errs = append(errs, err)
	}
	return done, errors.Join(errs...)
}

// slotDirs are the record directories of the deployer.
func slotDirs(stateDir string) []string {
	return []string{filepath.Join(stateDir, "deployments"), filepath.Join(stateDir, "slots"), filepath.Join(stateDir, "instances"),
		filepath.Join(stateDir, "lowers", "records")}
}

// mkdirs makes the state directories.
func mkdirs(stateDir string) error {
	for _, dir := range slotDirs(stateDir) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("deploy state dir: %w", err)
		}
	}
	return nil
}
