// What the PoP's state says a collection may touch: the control plane, fenced nodes, the slots deployments hold, statuses nobody owns.

package gc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// checkControlPlane refuses a plan, with an error wrapping
// state.ErrFenced and a hint, when etcd may not be the PoP's: it has no
// PoP record while the pool holds images of fogdeploy's deployments and
// checkpoints (an emptied or replaced etcd, against which every one would
// look orphaned), or a registered node is fenced (its agent found etcd
// emptied, replaced or rolled back).
func checkControlPlane(ctx context.Context, st *state.Store, names []string, nodes []state.Node) error {
	// A NotReady node's too: its instances may run on without an agent.
	var fenced, listed []string
	for _, n := range nodes {
		if n.Fence() != "" {
			fenced = append(fenced, n.Name)
			name := n.Name
			if !n.Ready {
				name += " (NotReady)"
			}
			listed = append(listed, name)
		}
	}
	if len(fenced) > 0 {
		return hint.With(fmt.Errorf("gc: %w: node(s) %s act on nothing, as their etcd is not the one they knew (%s); nothing is collected",
			state.ErrFenced, strings.Join(listed, ", "), nodeFence(nodes, fenced[0])),
			"restore etcd, or adopt this one on those nodes (pop-agent --adopt-pop) once its apps and deployments are checked; `fogctl node ls` says why each is fenced. "+
				"A node gone for good keeps its record: remove it with `etcdctl del --prefix "+state.Prefix+"nodes/NAME/`")
	}
	pop, _, err := st.PoP(ctx)
	if err != nil || pop != nil {
		return err
	}
	var ours []string
	for _, n := range names {
		if _, _, _, ok := catalog.ParseGenImage(n); ok || strings.HasPrefix(n, catalog.InstancePrefix) {
			ours = append(ours, n)
		}
	}
	if len(ours) == 0 {
		return nil // a new PoP on a new pool
	}
	return hint.With(fmt.Errorf("gc: %w: etcd has no PoP record (%s), while the pool holds %d image(s) of deployments and checkpoints (%s): "+
		"etcd may have been emptied or replaced, and each would look orphaned; nothing is collected", state.ErrFenced, state.PoPKey, len(ours), strings.Join(ours[:min(3, len(ours))], ", ")),
		"restore etcd from its backup; if it is new on purpose (or the images are another PoP's), let an agent adopt it (pop-agent --adopt-pop) or create an app, which records the PoP, then run gc again")
}

// nodeFence is why node name is fenced.
func nodeFence(nodes []state.Node, name string) string {
	for _, n := range nodes {
		if n.Name == name {
			return n.Name + ": " + n.Fence()
		}
	}
	return ""
}

// slotUse says which pool slots deployments hold, from their statuses,
// read once per plan.
type slotUse struct {
	// status: the deployments that have a status, withdrawn ones too
	// (their agents have not forgotten them yet).
	status map[string]bool
	// bound: "node/slot" that a deployment's status names.
	bound map[string]bool
	// unsure: by node, the deployments that may hold a slot their status
	// does not name: a deploy whose status is not written yet (a pool hit
	// that bound a slot says which only once it runs).
	unsure map[string][]string
}

// slotOwners reads which slots the statuses of deps (and of withdrawn
// deployments not forgotten yet) name, and which deployments may hold one
// that theirs does not name.
func slotOwners(ctx context.Context, st *state.Store, deps []state.Deployment) (slotUse, error) {
	sts, err := st.Statuses(ctx)
	if err != nil {
		return slotUse{}, err
	}
	u := slotUse{status: map[string]bool{}, bound: map[string]bool{}, unsure: map[string][]string{}}
	for id, s := range sts {
		u.status[id] = true
		if s.Slot != "" {
			u.bound[s.Node+"/"+s.Slot] = true
		}
	}
	// A withdrawn deployment's status on a NotReady node goes with the
	// same plan (staleStatuses): its agent, when back, undoes what its
	// record names.
	for _, d := range deps {
		s, ok := sts[d.ID]
		if !ok || s.Slot == "" && s.Phase != spec.PhaseFailed && s.Phase != spec.PhaseCheckpointed && s.Phase != spec.PhaseSuspended {
			// Failed released its slot; a checkpoint run keeps none.
			u.unsure[d.Node] = append(u.unsure[d.Node], d.ID)
		}
	}
	for _, ids := range u.unsure {
		slices.Sort(ids)
	}
	return u, nil
}

func staleStatuses(ctx context.Context, st *state.Store, nodes []state.Node) ([]Item, error) {
	var out []Item
	for _, n := range nodes {
		if n.Ready {
			continue // its agent forgets them itself
		}
		ids, err := st.StaleStatuses(ctx, n.Name)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			out = append(out, Item{Kind: KindStatus, Name: id, Reason: "withdrawn, and node " + n.Name + " is NotReady"})
		}
	}
	return out, nil
}

// keepUnseenOwners marks Skip, with why, each item of plan that would
// remove an image an etcd restored from an older backup would wrongly
// call an orphan (with the agents down, no node was there to be fenced by
// it), by two rules:
//   - its own record of its owner (catalog.MetaEtcd: the etcd revision at
//     which the node that made it held its owner) is contradicted: an
//     instance's or a suspension's clone whose deployment, or a generation
//     whose app, this etcd did not hold at that revision, or a revision
//     this etcd has not reached. An etcd that no longer keeps that
//     revision's history says nothing by this rule;
//   - it was made after the PoP's last backup (last; nil: none recorded),
//     which an etcd restored from that backup would not know of.
func (c Config) keepUnseenOwners(ctx context.Context, plan []Item, last *state.Backup) error {
	for i := range plan {
		it := &plan[i]
		if it.Skip {
			continue
		}
		// A clone's owner is the deployment it records; a generation's,
		// its app.
		var imgs []string
		app := ""
		switch it.Kind {
		case KindClone:
			imgs = it.Images
		case KindPartial:
			imgs, app = []string{catalog.GenImage(it.App, it.Gen, "ckpt")}, it.App
		}
		for _, img := range imgs {
			why, err := c.unseenOwner(ctx, img, app, last)
			if err != nil {
				return err
			}
			if why != "" {
				it.Skip, it.Reason = true, why
				break
			}
		}
	}
	return nil
}

// unseenOwner is why image img (of app, for a generation's) stays, or "".
func (c Config) unseenOwner(ctx context.Context, img, app string, last *state.Backup) (string, error) {
	info, err := c.Store.Stat(ctx, img)
	if errors.Is(err, layering.ErrNotFound) {
		return "", nil
	} else if err != nil {
		return "", err
	}
	if last != nil && info.Created.After(last.Taken) {
		return fmt.Sprintf("made at %s, after the PoP's last backup (%s): an etcd restored from that backup would not know it; a new backup (`fogctl pop backup`) lets gc remove it",
			info.Created.UTC().Format(time.RFC3339), last.Taken.Format(time.RFC3339)), nil
	}
	rev, _ := strconv.ParseInt(info.Meta[catalog.MetaEtcd], 10, 64)
	if rev <= 0 {
		return "", nil
	}
	if app != "" {
		seen, err := c.State.AppSeen(ctx, app, rev)
		return unseenReason(seen, "app "+app, rev), err
	}
	id := info.Meta[catalog.MetaDeployment]
	if id == "" {
		return "", nil
	}
	seen, err := c.State.DeploymentSeen(ctx, id, rev)
	return unseenReason(seen, "deployment "+id, rev), err
}

// unseenReason is why an image of owner, stamped at revision rev, stays.
func unseenReason(seen state.Seen, owner string, rev int64) string {
	const what = "etcd may have been restored from an older backup: restore the newer one, or, once you know its owner is gone for good, remove its images with `rbd rm`"
	switch seen {
	case state.SeenNever:
		return fmt.Sprintf("its node held %s at etcd revision %d, and this etcd has no record of it there: %s", owner, rev, what)
	case state.SeenAhead:
		return fmt.Sprintf("its node held %s at etcd revision %d, beyond this etcd's newest: %s", owner, rev, what)
	}
	return ""
}
