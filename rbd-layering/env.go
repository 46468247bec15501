package layering

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// Metadata keys set on every image fogdeploy creates.
const (
	MetaKind    = "fogdeploy.kind"    // "layer", "checkpoint", "instance"
	MetaStep    = "fogdeploy.step"    // the build step that made a layer
	MetaCreated = "fogdeploy.created" // RFC 3339
)

// LayerPrefix starts the name of every environment layer image.
const LayerPrefix = "fdl-"

// ExecPrefix starts the name of Exec's throwaway clones: Exec removes its
// own, and `fogctl gc` those of an Exec killed before it could.
const ExecPrefix = "fdx-"

// Mounter maps an image on this node and mounts its filesystem. The
// mapper package implements it with krbd, rbd-nbd or rbd-fuse + loop.
type Mounter interface {
	// Mount maps image and mounts its ext4 filesystem at target. When
	// format is set and the image holds no filesystem yet, it makes one.
	// The returned func unmounts and unmaps; it is safe to call once.
	Mount(ctx context.Context, image, target string, opts MountOptions) (unmount func(context.Context) error, err error)
}

// MountOptions modify Mounter.Mount.
type MountOptions struct {
	ReadOnly bool
	Format   bool
}

// ImageConfig is the container configuration that travels with an
// environment: what ENV and WORKDIR steps set.
type ImageConfig struct {
	Env     []string `json:"env,omitempty"`
	WorkDir string   `json:"workdir,omitempty"`
}

// Environment is the catalog record of a named environment.
type Environment struct {
	Name    string      `json:"name"`
	Ref     SnapRef     `json:"ref"`
	Config  ImageConfig `json:"config"`
	Source  string      `json:"source"`
	History []string    `json:"history,omitempty"`
	Created time.Time   `json:"created"`
}

// EnvInfo is an environment with what the store says of it.
type EnvInfo struct {
	Environment
	// Chain lists the snapshots from the environment's own to the root.
	Chain    []SnapRef `json:"chain"`
	Depth    int       `json:"depth"`
	Size     int64     `json:"size"`
	Used     int64     `json:"used"`
	Children []string  `json:"children"`
}

// ManagerConfig holds the environment manager's tunables.
type ManagerConfig struct {
	// WorkDir holds scratch files and mountpoints on this node.
	WorkDir string
	// DefaultSize is the size of imported images when none is given;
	// zero means twice the content plus 1 GiB, at least 2 GiB.
	DefaultSize int64
	// SoftDepth and HardDepth limit clone chains: past the soft limit a
	// warning, past the hard limit a refusal (ceph-csi: 4 and 8).
	SoftDepth int
	HardDepth int
	// HostNetwork lets a RUN step or an exec ask for the node's own
	// network (--network=host). Off, such a step is refused: the default
	// network reaches out through NAT only (NetworkDefault).
	HostNetwork bool
}

// Validate reports every problem at once.
func (c ManagerConfig) Validate() error {
	var errs []error
	if c.WorkDir == "" {
		errs = append(errs, errors.New("layering work_dir is empty: set a local directory for scratch files"))
	}
	if c.DefaultSize < 0 {
		errs = append(errs, fmt.Errorf("layering default_size %d is negative", c.DefaultSize))
	}
	if c.SoftDepth < 1 || c.HardDepth < 1 {
		errs = append(errs, fmt.Errorf("layering depth limits soft=%d hard=%d: both must be at least 1 (defaults 4 and 8)", c.SoftDepth, c.HardDepth))
	} else if c.SoftDepth > c.HardDepth {
		errs = append(errs, fmt.Errorf("layering soft_depth %d is above hard_depth %d: the soft limit must not exceed the hard one", c.SoftDepth, c.HardDepth))
	}
	return errors.Join(errs...)
}

// DefaultManagerConfig returns the defaults (depth limits 4 and 8).
func DefaultManagerConfig(workDir string) ManagerConfig {
	return ManagerConfig{WorkDir: workDir, SoftDepth: 4, HardDepth: 8}
}

// Progress receives one line per step of a long operation.
type Progress func(format string, args ...any)

func (p Progress) say(format string, args ...any) {
	if p != nil {
		p(format, args...)
	}
}

// Manager imports, builds, lists and removes environments.
type Manager struct {
	b   Backend
	m   Mounter
	cfg ManagerConfig
	log *slog.Logger
	// start is this process's start time, in the names of its scratch
	// directories (scratch.go).
	start uint64
}

// NewManager returns a manager over a backend and a mounter.
func NewManager(b Backend, m Mounter, cfg ManagerConfig, log *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("layering work dir: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start, _ := procstat.Start(os.Getpid())
	mgr := &Manager{b: b, m: m, cfg: cfg, log: log, start: start}
	if _, err := mgr.sweepScratch(); err != nil {
		log.Warn("looking for the scratch directories of processes that are gone", "dir", cfg.WorkDir, "err", err)
	}
	return mgr, nil
}

// Mounter returns the mounter the manager uses.
func (m *Manager) Mounter() Mounter { return m.m }

// Backend returns the store the manager uses.
func (m *Manager) Backend() Backend { return m.b }

// Get returns the catalog record of an environment.
func (m *Manager) Get(ctx context.Context, name string) (Environment, error) {
	e, _, err := m.get(ctx, name)
	return e, err
}

// get is Get with the record as the catalog holds it.
func (m *Manager) get(ctx context.Context, name string) (Environment, []byte, error) {
	if err := ValidateName("environment", name); err != nil {
		return Environment{}, nil, err
	}
	raw, err := m.b.Tag(ctx, name)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Environment{}, nil, hint.With(fmt.Errorf("environment %q: %w", name, ErrNotFound), "list environments with `fogctl env ls`")
		}
		return Environment{}, nil, err
	}
	var e Environment
	if err := json.Unmarshal(raw, &e); err != nil {
		return Environment{}, nil, fmt.Errorf("environment %q: corrupt catalog record: %w", name, err)
	}
	return e, raw, nil
}

// put points e's name at e, whatever it pointed at.
func (m *Manager) put(ctx context.Context, e Environment) error {
	raw, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return m.b.SetTag(ctx, e.Name, raw)
}

// swap points e's name at e only if its catalog record is still prev, as
// get read it (nil: the name had none), so that a command that ran
// meanwhile on any node is not overwritten: what did it says how.
func (m *Manager) swap(ctx context.Context, e Environment, prev []byte, did string) error {
	raw, err := json.Marshal(e)
	if err != nil {
		return err
	}
	err = m.b.SwapTag(ctx, e.Name, prev, raw)
	switch {
	case errors.Is(err, ErrExists):
		return hint.With(fmt.Errorf("%w while it was %s", err, did),
			"another command made it meanwhile: choose another name, or remove it with `fogctl env rm "+e.Name+"` first")
	case errors.Is(err, ErrConflict), prev != nil && errors.Is(err, ErrNotFound):
		return hint.With(fmt.Errorf("%w while it was %s", err, did),
			"another command rebuilt, changed or removed it meanwhile: check `fogctl env ls` and run the command again")
	}
	return err
}

// Chain returns the snapshots from ref up to the root, ref first.
func (m *Manager) Chain(ctx context.Context, ref SnapRef) ([]SnapRef, error) {
	chain := []SnapRef{ref}
	cur := ref.Image
	for range 64 {
		info, err := m.b.Stat(ctx, cur)
		if err != nil {
			return chain, err
		}
		if info.Parent == nil {
			return chain, nil
		}
		chain = append(chain, *info.Parent)
		cur = info.Parent.Image
	}
	return chain, fmt.Errorf("chain of %s longer than 64: %w", ref, ErrTooDeep)
}

// CheckDepth applies the depth limits to a clone of ref. It returns a
// warning (past the soft limit) or an ErrTooDeep error (past the hard one).
func (m *Manager) CheckDepth(ctx context.Context, ref SnapRef, envName string) (warning string, err error) {
	chain, err := m.Chain(ctx, ref)
	if err != nil {
		return "", err
	}
	depth := len(chain) // a clone of ref sits one below the chain
	switch {
	case depth > m.cfg.HardDepth:
		return "", hint.With(fmt.Errorf("a clone of %s would be %d clones deep, past the hard limit %d: %w", ref, depth, m.cfg.HardDepth, ErrTooDeep),
			fmt.Sprintf("flatten the environment first: `fogctl env flatten %s`", envName))
	case depth > m.cfg.SoftDepth:
		return fmt.Sprintf("a clone of %s is %d clones deep, past the soft limit %d: consider `fogctl env flatten %s`", ref, depth, m.cfg.SoftDepth, envName), nil
	}
	return "", nil
}

// Inspect returns an environment with its chain, sizes and children.
func (m *Manager) Inspect(ctx context.Context, name string) (EnvInfo, error) {
	e, err := m.Get(ctx, name)
	if err != nil {
		return EnvInfo{}, err
	}
	return m.info(ctx, e)
}

func (m *Manager) info(ctx context.Context, e Environment) (EnvInfo, error) {
	ei := EnvInfo{Environment: e}
	chain, err := m.Chain(ctx, e.Ref)
	if err != nil {
		return ei, err
	}
	ei.Chain, ei.Depth = chain, len(chain)-1
	st, err := m.b.Stat(ctx, e.Ref.Image)
	if err != nil {
		return ei, err
	}
	ei.Size = st.Size
	for _, r := range chain {
		if s, err := m.b.Stat(ctx, r.Image); err == nil {
			ei.Used += s.Used
		}
	}
	if ei.Children, err = m.b.Children(ctx, e.Ref); err != nil {
		return ei, err
	}
	if ei.Children == nil {
		ei.Children = []string{}
	}
	return ei, nil
}

// List returns every environment, sorted by name.
func (m *Manager) List(ctx context.Context) ([]EnvInfo, error) {
	tags, err := m.b.Tags(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]EnvInfo, 0, len(tags))
	for name, raw := range tags {
		var e Environment
		if err := json.Unmarshal(raw, &e); err != nil {
			m.log.Warn("corrupt catalog record", "env", name, "err", err)
			continue
		}
		ei, err := m.info(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("environment %q: %w", name, err)
		}
		out = append(out, ei)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes an environment. It refuses while the environment's
// snapshot has clones (instances, other environments built on it). Cached
// layers below it that no other environment or clone uses go too. It
// returns the images it removed.
func (m *Manager) Remove(ctx context.Context, name string) ([]string, error) {
	e, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	kids, err := m.b.Children(ctx, e.Ref)
	if err != nil {
		return nil, err
	}
	var removed []string
	if len(kids) > 0 {
		// Cached layers of superseded builds count as children; they go first.
		if removed, err = m.Prune(ctx, PruneOptions{UnsealedMinAge: DefaultUnsealedMinAge}); err != nil {
			return removed, err
		}
		if kids, err = m.b.Children(ctx, e.Ref); err != nil {
			return removed, err
		}
	}
	if len(kids) > 0 {
		what := "undeploy the instances and remove the environments built on it first (see `fogctl env inspect " + name + "`)"
		if slices.ContainsFunc(kids, func(k string) bool { return strings.HasPrefix(k, ExecPrefix) }) {
			what += "; a " + ExecPrefix + " clone is what a killed `fogctl env exec` left: `fogctl gc` removes it"
		}
		return nil, hint.With(fmt.Errorf("environment %q: snapshot %s has clones %s: %w", name, e.Ref, strings.Join(kids, ", "), ErrHasChildren), what)
	}
	refs, err := m.refCounts(ctx, name)
	if err != nil {
		return nil, err
	}
	chain, err := m.Chain(ctx, e.Ref)
	if err != nil {
		return nil, err
	}
	if refs[e.Ref.Image] == 0 {
		if err := m.b.Remove(ctx, e.Ref.Image); err != nil {
			return nil, err
		}
		removed = append(removed, e.Ref.Image)
	}
	if err := m.b.DeleteTag(ctx, name); err != nil {
		return removed, err
	}
	if !slices.Contains(removed, e.Ref.Image) {
		return removed, nil
	}
	// Walk up: drop cached layers that no environment and no clone uses.
	for _, p := range chain[1:] {
		if refs[p.Image] > 0 || !strings.HasPrefix(p.Image, LayerPrefix) {
			break
		}
		if kids, err := m.b.Children(ctx, p); err != nil || len(kids) > 0 {
			break
		}
		if err := m.b.Remove(ctx, p.Image); err != nil {
			m.log.Warn("keeping cached layer", "image", p.Image, "err", err)
			break
		}
		removed = append(removed, p.Image)
	}
	return removed, nil
}

// PruneOptions tune Prune.
type PruneOptions struct {
	// UnsealedMinAge: a layer image without its sealed snapshot, which a
	// build step or an import killed halfway leaves, goes once it is this
	// old and nothing has it open; a younger one may be in the making.
	UnsealedMinAge time.Duration
}

// DefaultUnsealedMinAge is what Remove gives Prune, and fogctl's default.
const DefaultUnsealedMinAge = 10 * time.Minute

// Prune removes cached layers that no environment uses and nothing was
// cloned from: what rebuilds with changed steps leave behind, and the
// unsealed layers of builds and imports that were killed (opts). It
// repeats until nothing more can go, and returns the images it removed.
// A layer that is mapped or open (a build or an import in progress) stays.
func (m *Manager) Prune(ctx context.Context, opts PruneOptions) ([]string, error) {
	var removed []string
	for {
		refs, err := m.refCounts(ctx, "")
		if err != nil {
			return removed, err
		}
		names, err := m.b.List(ctx)
		if err != nil {
			return removed, err
		}
		n := 0
		for _, img := range names {
			if !strings.HasPrefix(img, LayerPrefix) || refs[img] > 0 {
				continue
			}
			info, err := m.b.Stat(ctx, img)
			if err != nil {
				continue
			}
			switch unsealed := len(info.Snapshots) == 0; {
			case unsealed && time.Since(info.Created) < opts.UnsealedMinAge:
				continue // maybe in the making
			case unsealed:
			case len(info.Snapshots) != 1 || info.Snapshots[0].Name != SealedSnap:
				continue
			default:
				if kids, err := m.b.Children(ctx, SnapRef{Image: img, Snap: SealedSnap}); err != nil || len(kids) > 0 {
					continue
				}
			}
			if err := m.b.Remove(ctx, img); err != nil {
				if !errors.Is(err, ErrBusy) {
					m.log.Warn("prune: keeping layer", "image", img, "err", err)
				}
				continue
			}
			removed = append(removed, img)
			n++
		}
		if n == 0 {
			return removed, nil
		}
	}
}

// refCounts counts, per image, how many environments other than except
// point at it.
func (m *Manager) refCounts(ctx context.Context, except string) (map[string]int, error) {
	tags, err := m.b.Tags(ctx)
	if err != nil {
		return nil, err
	}
	refs := map[string]int{}
	for n, raw := range tags {
		if n == except {
			continue
		}
		var e Environment
		if json.Unmarshal(raw, &e) == nil {
			refs[e.Ref.Image]++
		}
	}
	return refs, nil
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (m *Manager) tagImage(ctx context.Context, image, kind, step string) {
	meta := map[string]string{MetaKind: kind, MetaCreated: time.Now().UTC().Format(time.RFC3339)}
	if step != "" {
		meta[MetaStep] = step
	}
	if err := m.b.SetMeta(ctx, image, meta); err != nil {
		m.log.Warn("set image metadata", "image", image, "err", err)
	}
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}
