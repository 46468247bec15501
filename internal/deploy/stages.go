// The stages every instance goes through, whatever starts it: begin (a record), clone + map + mount
// (cloneMapMount), start (the driver's Create, then Start), ready and running, with undo on error.

package deploy

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"time"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

// running marks an instance that answered Running, with the engine's own
// time to ready (timing phase) when its driver reports it.
func (d *Deployer) running(ctx context.Context, o *op, dr Driver, h Handle, app App, phase string) (Deployment, error) {
	if c, ok := dr.(*Container); ok {
		o.rec.EngineReadyMS = c.engineReady(ctx, h, app, phase)
	}
	o.rec.Phase = PhaseRunning
	if err := d.save(o.rec); err != nil {
		return Deployment{}, err
	}
	d.log.Info("deployed", "id", o.rec.ID, "app", o.rec.App, "mode", o.rec.Mode, "gen", o.rec.Gen, "ports", h.Ports, "timings", o.rec.Timings.String())
	return *o.rec, nil
}

func prefixed(p string, t layering.Timings) layering.Timings {
	out := make(layering.Timings, len(t))
	for i, ph := range t {
		out[i] = layering.Phase{Name: p + ph.Name, Duration: ph.Duration}
	}
	return out
}

// op is one multi-step operation: a record written before each step, and
// the timing of each phase.
type op struct {
	d     *Deployer
	rec   *Deployment
	start time.Time
	prog  func(string, time.Duration)
}

func (o *op) phase(name string) {
	now := time.Now()
	took := now.Sub(o.start)
	o.rec.Timings = append(o.rec.Timings, layering.Phase{Name: name, Duration: took})
	o.start = now
	if o.prog != nil {
		o.prog(name, took)
	}
}

// own records images and mappings before they are made.
func (o *op) own(images []string, mappings []string) error {
	o.rec.Images = append(o.rec.Images, images...)
	o.rec.Mappings = append(o.rec.Mappings, mappings...)
	return o.d.save(o.rec)
}

// undoOnError marks the record Failed and undeploys it when *err is set.
func (o *op) undoOnError(ctx context.Context, err *error) {
	if *err == nil {
		return
	}
	o.rec.Phase, o.rec.Error = PhaseFailed, (*err).Error()
	_ = o.d.save(o.rec)
	*err = errors.Join(*err, o.d.Undeploy(context.WithoutCancel(ctx), o.rec.ID))
}

// cloneMapMount clones (or creates) the env and ckpt images of a
// deployment (o.rec.Images) and mounts them under its dir. A record that
// owns only an env image (a boot) gets no checkpoint image.
func (o *op) cloneMapMount(ctx context.Context, env layering.SnapRef, ckpt *layering.SnapRef, ckptSize int64) (envPath, ckptPath string, err error) {
	id := o.rec.ID
	envImg, withCkpt := o.rec.Images[0], len(o.rec.Images) > 1
	st, mp := o.d.deps.Store, o.d.deps.Mapper
	// ckptStep runs f on the checkpoint image, if the record has one.
	ckptStep := func(f func(img string) error) func() error {
		return func() error {
			if !withCkpt {
				return nil
			}
			return f(o.rec.Images[1])
		}
	}
	// The two images are independent: each step runs on both at once.
	if err := both(
		func() error { return st.Clone(ctx, env, envImg) },
		ckptStep(func(img string) error {
			if ckpt != nil {
				return st.Clone(ctx, *ckpt, img)
			}
			return st.Create(ctx, img, ckptSize)
		})); err != nil {
		return "", "", err
	}
	for _, img := range o.rec.Images {
		_ = st.SetMeta(ctx, img, MetaDeployment, id)
		if o.d.cfg.Node != "" {
			_ = st.SetMeta(ctx, img, MetaNode, o.d.cfg.Node)
		}
	}
	o.phase("clone")
	var envMap, ckptMap *mapper.Mapping
	if err := both(
		func() (err error) {
			envMap, err = mp.Map(ctx, mapper.Image{Pool: o.d.cfg.Pool, Name: envImg}, mapper.WithID(id+"-env"))
			return err
		},
		ckptStep(func(img string) (err error) {
			ckptMap, err = mp.Map(ctx, mapper.Image{Pool: o.d.cfg.Pool, Name: img}, mapper.WithID(id+"-ckpt"))
			return err
		})); err != nil {
		return "", "", err
	}
	o.phase("map")
	envPath = filepath.Join(o.rec.Dir, "root")
	if withCkpt {
		ckptPath = filepath.Join(o.rec.Dir, "ckpt")
	}
	if err := both(
		func() error { return mp.Mount(ctx, envMap, envPath, mapper.MountOptions{}) },
		ckptStep(func(string) error {
			return mp.Mount(ctx, ckptMap, ckptPath, mapper.MountOptions{Format: ckpt == nil})
		})); err != nil {
		return "", "", err
	}
	o.phase("mount")
	return envPath, ckptPath, nil
}

// both runs a and b concurrently and joins their errors.
func both(a, b func() error) error {
	var wg sync.WaitGroup
	var ea, eb error
	wg.Go(func() { ea = a() })
	wg.Go(func() { eb = b() })
	wg.Wait()
	return errors.Join(ea, eb)
}

// begin creates the record of a new deployment or boot.
func (d *Deployer) begin(id, app string, gen int, phase string, prog func(string, time.Duration)) (*op, error) {
	rec := &Deployment{ID: id, App: app, Node: d.cfg.Node, Phase: phase, Gen: gen, Created: time.Now().UTC(),
		Dir: filepath.Join(d.cfg.StateDir, "instances", id)}
	if err := d.create(rec); err != nil {
		return nil, err
	}
	return &op{d: d, rec: rec, start: time.Now(), prog: prog}, nil
}

// start creates the instance, records its handle, then starts it: a crash
// between the two leaves a record whose Undeploy (or Recover) removes the
// created instance. The phase "container" measures both steps.
func (d *Deployer) start(ctx context.Context, o *op, dr Driver, r Run) (Handle, error) {
	h, err := dr.Create(ctx, r)
	if err != nil {
		return Handle{}, err
	}
	o.rec.Handle = &h
	if err := d.save(o.rec); err != nil {
		_ = dr.Remove(context.WithoutCancel(ctx), h)
		return Handle{}, err
	}
	// From here on the record owns the instance: on error, undoOnError
	// removes it through the record.
	h, err = dr.Start(ctx, h)
	if err != nil {
		return Handle{}, err
	}
	o.rec.Handle = &h
	o.rec.Ports = h.Ports
	if err := d.save(o.rec); err != nil {
		return Handle{}, err
	}
	o.phase("container")
	return h, nil
}
