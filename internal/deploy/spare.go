// Spare slots: slots made for no app. A spare holds what every restore's slot has in common on the
// shared read path: a writable image (a clone of a blank filesystem) mapped and mounted, a shared
// mount directory, and a light container created, at background priority, its generic ports
// published, waiting to be assigned. A restore that finds no pool slot of its app takes a spare of
// its engine that fits it (drivers.Sparer.Fits) and only attaches its app to it: the overlay root
// over the node's copy of the environment, the node's copy of the checkpoint bound read-only, its
// ports pointed at the spare's, the restart assigned (StepAttach). What the agent keeps of them is
// its policy (pop-agent/agent/spare.go).

package deploy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// StepAttach: a restore that took a spare slot attached its app to it
// (root, checkpoint, ports, assignment).
const StepAttach Step = "attach"

// Defaults of a spare slot (Config.SparePorts, Config.SpareBytes).
const (
	DefaultSparePorts       = 4
	DefaultSpareBytes int64 = 4 << 30
)

// ErrNoSpare: this node has no idle spare slot that fits the restore.
var ErrNoSpare = errors.New("no spare slot")

// errNoIdleSpare: no spare of the restore's engine is idle (nothing to
// say about it).
var errNoIdleSpare = fmt.Errorf("%w idle", ErrNoSpare)

// SpareSlot is what a spare slot was made with (Slot.Spare).
type SpareSlot struct {
	Engine engine.Name `json:"engine"`
	// Ports is how many generic ports its instance publishes.
	Ports int `json:"ports"`
	// Bytes is the size of its writable image: it takes apps whose
	// environment is no larger.
	Bytes  int64       `json:"bytes"`
	Limits spec.Limits `json:"limits"`
}

// spareOf is the driver's description of spare slot s.
func spareOf(s *Slot) drivers.Spare {
	return drivers.Spare{ID: s.ID, Engine: s.Spare.Engine, MntPath: filepath.Join(s.Dir, "mnt"), CtlPath: filepath.Join(s.Dir, "ctl"),
		Ports: s.Spare.Ports, Limits: s.Spare.Limits}
}

// sparer is the driver that makes spares of engine eng on this node, or
// why there is none (ErrNoSpare).
func (p *Pool) sparer(ctx context.Context, eng engine.Name) (drivers.Sparer, error) {
	if p.cfg.EnvRead != EnvShared {
		return nil, fmt.Errorf("%w of engine %s: restores read their own clone of the environment (agent.env_read: clone)", ErrNoSpare, eng)
	}
	dr, err := p.drv.engineDriver(eng)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoSpare, err)
	}
	sp, ok := dr.(drivers.Sparer)
	if !ok {
		return nil, fmt.Errorf("%w of engine %s: its driver makes none", ErrNoSpare, eng)
	}
	if err := sp.MakesSpares(ctx, eng); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoSpare, err)
	}
	return sp, nil
}

// MakesSpares reports, wrapping ErrNoSpare, why this node makes no spare
// slots of engine eng (nil when it does).
func (p *Pool) MakesSpares(ctx context.Context, eng engine.Name) error {
	_, err := p.sparer(ctx, eng)
	return err
}

// ProvisionSpare makes one spare slot of engine eng on this node, at
// background priority: its writable image cloned from the blank
// filesystem of Config.SpareBytes, mapped and mounted, its mount
// directory shared, its instance created and waiting. On error nothing
// of it is left.
func (p *Pool) ProvisionSpare(ctx context.Context, eng engine.Name) (_ Slot, err error) {
	dr, err := p.sparer(ctx, eng)
	if err != nil {
		return Slot{}, err
	}
	id := NewSlotID(spec.SpareApp)
	s := &Slot{ID: id, Node: p.cfg.Node, Mode: drivers.RunRestart, Phase: SlotProvisioning,
		Spare: &SpareSlot{Engine: eng, Ports: p.cfg.SparePorts, Bytes: p.cfg.SpareBytes, Limits: p.cfg.Limits},
		Owned: Owned{Images: []string{catalog.InstancePrefix + id + "-env"}, Mappings: []string{id + "-env"},
			Dir: filepath.Join(p.cfg.StateDir, "instances", id)},
		Created: time.Now().UTC()}
	if err := p.slots.Create(id, s, true); err != nil {
		return Slot{}, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.ReleaseSlot(context.WithoutCancel(ctx), id))
		}
	}()
	o := p.stages.newOp(&s.Timings, nil)
	of := Lower{App: spec.SpareApp, Size: s.Spare.Bytes}
	blank, err := p.envs.upperSource(ctx, of)
	if err != nil {
		return Slot{}, err
	}
	if err := p.envs.cloneBlank(ctx, blank, of, s.Images[0]); err != nil {
		return Slot{}, err
	}
	st := p.deps.Store
	meta := map[string]string{catalog.MetaSlot: s.ID}
	if p.cfg.Node != "" {
		meta[catalog.MetaNode] = p.cfg.Node
	}
	_ = st.SetMeta(ctx, s.Images[0], meta) // before it is mapped: a mapping holds its lock
	o.phase(StepClone)
	envMap, _, err := p.stages.mapSlot(ctx, s)
	if err != nil {
		return Slot{}, err
	}
	o.phase(StepMap)
	if err := p.deps.Mapper.Mount(ctx, envMap, filepath.Join(s.Dir, "disk"), mapper.MountOptions{}); err != nil {
		return Slot{}, err
	}
	sp := spareOf(s)
	if err := p.deps.Roots.MountShared(sp.MntPath); err != nil {
		return Slot{}, err
	}
	o.phase(StepMount)
	if err := os.MkdirAll(sp.CtlPath, 0o755); err != nil {
		return Slot{}, fmt.Errorf("spare %s control directory: %w", id, err)
	}
	h, err := dr.CreateSpare(ctx, sp)
	if err != nil {
		return Slot{}, err
	}
	s.Handle, s.Phase = &h, SlotIdle
	if err := p.slots.Save(id, s); err != nil {
		_ = dr.Remove(context.WithoutCancel(ctx), h)
		return Slot{}, err
	}
	o.phase(StepContainer)
	p.slotMu.Lock()
	p.spares[id] = *s
	p.slotMu.Unlock()
	p.log.Info("spare slot provisioned", "slot", id, "engine", eng, "timings", s.Timings.String())
	return *s, nil
}

// SpareSlots returns this node's spare slots, oldest first: idle, and
// being provisioned or attached.
func (p *Pool) SpareSlots() ([]Slot, error) {
	all, err := p.Slots()
	if err != nil {
		return nil, err
	}
	var out []Slot
	for _, s := range all {
		if s.Spare != nil {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// ReleaseSpares releases idle spare slots of engine eng ("": any), n at the
// most (n < 0: all), the newest first, and every spare of eng whose release
// failed before (its record says Releasing), as DropPool does the pool's:
// no spare stays half released, and counted by no one, until the agent's
// next start. It returns the released IDs.
func (p *Pool) ReleaseSpares(ctx context.Context, eng engine.Name, n int) ([]string, error) {
	p.slotMu.Lock()
	all, err := p.slots.List()
	if err != nil {
		p.slotMu.Unlock()
		return nil, err
	}
	var idle, picked []Slot
	for _, s := range p.spares {
		if eng == "" || s.Spare.Engine == eng {
			idle = append(idle, s)
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].Created.After(idle[j].Created) })
	if n >= 0 && len(idle) > n {
		idle = idle[:n]
	}
	for _, s := range idle {
		if err = p.markReleasing(&s); err != nil {
			break
		}
		delete(p.spares, s.ID)
		picked = append(picked, s)
	}
	for _, s := range all {
		if s.Spare != nil && (eng == "" || s.Spare.Engine == eng) && s.Phase == SlotReleasing && !p.releasing[s.ID] {
			p.releasing[s.ID] = true
			picked = append(picked, s)
		}
	}
	p.slotMu.Unlock()
	done, rerr := p.releasePicked(ctx, picked)
	return done, errors.Join(rerr, err)
}

// claimSpare takes the oldest idle spare slot of engine eng that run r
// fits, for deployment dep, or returns ErrNoSpare. Like claim, it writes
// nothing: the deploy saves the slot's record once it attaches.
func (p *Pool) claimSpare(dr drivers.Sparer, eng engine.Name, r drivers.Run, dep string) (*Slot, error) {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	var best *Slot
	var why error
	for id := range p.spares {
		s := p.spares[id]
		if s.Spare.Engine != eng || s.Handle == nil {
			continue
		}
		if err := dr.Fits(spareOf(&s), r); err != nil {
			why = err
			continue
		}
		if best == nil || s.Created.Before(best.Created) {
			best = &s
		}
	}
	if best == nil {
		if why != nil {
			return nil, fmt.Errorf("%w: %w", ErrNoSpare, why)
		}
		return nil, fmt.Errorf("%w of engine %s idle", ErrNoSpare, eng)
	}
	delete(p.spares, best.ID)
	s := *best
	h := *s.Handle
	s.Handle, s.Deployment = &h, dep
	return &s, nil
}

// unclaimSpare gives spare s, untouched, back to the index.
func (p *Pool) unclaimSpare(s *Slot) {
	s.Deployment = ""
	p.slotMu.Lock()
	p.spares[s.ID] = *s
	p.slotMu.Unlock()
}

// takeSpare is a restore of generation g for deployment rec in a spare
// slot: it claims one that fits the restore's run, then attaches the app
// to it. ErrNoSpare when none fits (rec untouched): the restore
// provisions a slot of its own. Once claimed, the spare is the
// deployment's (its record names it), and an error releases it.
func (p *Pool) takeSpare(ctx context.Context, o *op, rec *Deployment, app spec.App, g spec.Generation) (*Slot, error) {
	if !p.hasSpare(g.Engine) {
		return nil, errNoIdleSpare
	}
	dr, err := p.drv.engineDriver(g.Engine)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoSpare, err)
	}
	sp, ok := dr.(drivers.Sparer)
	if !ok {
		return nil, fmt.Errorf("%w of engine %s: its driver makes none", ErrNoSpare, g.Engine)
	}
	if size, err := p.envSize(ctx, g); err != nil {
		return nil, err
	} else if size > p.cfg.SpareBytes {
		return nil, fmt.Errorf("%w: the environment of %s (%d bytes) is larger than a spare's writable image (%d bytes)", ErrNoSpare, app.Name, size, p.cfg.SpareBytes)
	}
	run := drivers.Run{Mode: drivers.RunRestart, ID: rec.ID, App: app, Gen: g.Gen, Limits: p.cfg.Limits}
	s, err := p.claimSpare(sp, g.Engine, run, rec.ID)
	if err != nil {
		return nil, err
	}
	// From here the slot is the deployment's: its record names it first.
	s.App, s.Gen, s.Phase, s.Lower = app.Name, g.Gen, SlotClaimed, lowerID(app.Name, g.Gen)
	if err := p.slots.Save(s.ID, s); err != nil {
		p.unclaimSpare(s)
		return nil, err
	}
	rec.Slot, rec.Pool = s.ID, spec.PoolSpare
	if err := p.recs.create(rec); err != nil {
		rec.Slot, rec.Pool = "", ""
		return nil, errors.Join(err, p.ReleaseSlot(context.WithoutCancel(ctx), s.ID))
	}
	return s, p.attach(ctx, o, s, sp, run, g)
}

// hasSpare reports whether an idle spare slot of engine eng waits here.
func (p *Pool) hasSpare(eng engine.Name) bool {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	for _, s := range p.spares {
		if s.Spare.Engine == eng {
			return true
		}
	}
	return false
}

// envSize is the size of generation g's environment: its node copy's
// record says it, else its image.
func (p *Pool) envSize(ctx context.Context, g spec.Generation) (int64, error) {
	if l, err := p.envs.lowers.Load(lowerID(g.App, g.Gen)); err == nil && l.Size > 0 {
		return l.Size, nil
	}
	info, err := p.deps.Store.Stat(ctx, g.EnvSnap.Image)
	if err != nil {
		return 0, fmt.Errorf("size of the environment of %s generation %d: %w", g.App, g.Gen, err)
	}
	return info.Size, nil
}

// attach attaches the app of run r, restoring generation g, to spare slot
// s: the node's copies of its environment and checkpoint (made or fetched
// if the node has none), the overlay root over the first with the spare's
// writable image as its upper layer, the second bound read-only in the
// instance's checkpoint volume, then the driver's Assign.
func (p *Pool) attach(ctx context.Context, o *op, s *Slot, dr drivers.Sparer, r drivers.Run, g spec.Generation) error {
	var lower Lower
	var src string
	if err := both(
		func() (err error) {
			lower, err = p.envs.lowerFor(ctx, g)
			return err
		},
		func() error {
			e, fetched, err := p.ckpts.ckptSource(ctx, g, nil, nil)
			src, s.Fetched = e.Dir, fetched
			return err
		}); err != nil {
		return err
	}
	if s.Fetched {
		o.phase(StepFetch) // the node held no copy of the checkpoint
	}
	if lower.Size > s.Spare.Bytes {
		return fmt.Errorf("the environment of %s (%d bytes) is larger than spare %s's writable image (%d bytes)", r.App.Name, lower.Size, s.ID, s.Spare.Bytes)
	}
	sp := spareOf(s)
	// The restart it is assigned reads its root and checkpoint only once
	// ordered: both are mounted meanwhile.
	r.EnvFiles = lower.Root
	var h drivers.Handle
	if err := both(
		func() error {
			if _, err := p.envs.overlayRoot(ctx, lower, s.Dir); err != nil {
				return err
			}
			return p.deps.Roots.BindReadOnly(src, filepath.Join(sp.SpareCkpt(), strconv.Itoa(g.Gen)))
		},
		func() (err error) {
			h, err = dr.Assign(ctx, *s.Handle, sp, r)
			return err
		}); err != nil {
		return err
	}
	s.Handle, s.Ports = &h, h.Ports
	if err := p.slots.Save(s.ID, s); err != nil {
		return err
	}
	o.phase(StepAttach)
	return nil
}
