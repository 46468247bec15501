// The instances' networks and their bounded output, as Docker gives them:
// fogdeploy's own bridge networks (made on first use) and the tail of a
// container's logs that Logs keeps.

package runtime

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
)

// ensureNetwork makes fogdeploy's bridge network name unless it exists:
// with inter-container traffic off unless open. Two agents or deploys
// making it at once: the one that finds it made takes it; two that both
// made it (dockerd's check of a duplicate name is not atomic, and a
// container is then refused: "network ... is ambiguous") keep the one of
// the lowest ID and remove the other.
//
// Implements: GET /networks/{name}, POST /networks/create, GET /networks,
// DELETE /networks/{id}.
func (d *Docker) ensureNetwork(ctx context.Context, name string, open bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.made[name] {
		return nil
	}
	if err := d.dedupeNetwork(ctx, name); err != nil {
		return d.wrap("network", name, err)
	}
	nw, err := d.api.NetworkInspect(ctx, name, network.InspectOptions{})
	if cerrdefs.IsNotFound(err) {
		_, err = d.api.NetworkCreate(ctx, name, network.CreateOptions{Driver: "bridge",
			Options: map[string]string{"com.docker.network.bridge.enable_icc": strconv.FormatBool(open)},
			Labels:  map[string]string{LabelManaged: "true"}})
		if cerrdefs.IsConflict(err) {
			err = nil
		}
		if err == nil {
			d.log.Info("network made", "network", name, "containers_reach_each_other", open)
			err = d.dedupeNetwork(ctx, name)
		}
	} else if err == nil && nw.Options["com.docker.network.bridge.enable_icc"] != strconv.FormatBool(open) {
		err = fmt.Errorf("network %s exists with enable_icc=%q, not %v: %w", name, nw.Options["com.docker.network.bridge.enable_icc"], open, ErrConflict)
	}
	if err != nil {
		return d.wrap("network", name, err)
	}
	if d.made == nil {
		d.made = map[string]bool{}
	}
	d.made[name] = true
	return nil
}

// dedupeNetwork removes the networks named name but the one of the
// lowest ID (made at once by two processes).
func (d *Docker) dedupeNetwork(ctx context.Context, name string) error {
	nws, err := d.api.NetworkList(ctx, network.ListOptions{Filters: filters.NewArgs(filters.Arg("name", name))})
	if err != nil {
		return err
	}
	nws = slices.DeleteFunc(nws, func(n network.Summary) bool { return n.Name != name }) // the filter matches a part
	if len(nws) < 2 {
		return nil
	}
	slices.SortFunc(nws, func(a, b network.Summary) int { return strings.Compare(a.ID, b.ID) })
	for _, n := range nws[1:] {
		if err := d.api.NetworkRemove(ctx, n.ID); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("network %s made twice: removing %s: %w", name, n.ID, err)
		}
		d.log.Warn("network made twice at once; one removed", "network", name, "removed", n.ID, "kept", nws[0].ID)
	}
	return nil
}

// MaxLogBytes bounds what Logs returns: the last bytes of a container's
// output, however much it wrote (its lines are long, or tail is all).
const MaxLogBytes = 1 << 20

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	b   []byte
	max int
	cut bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.b, t.cut = append(t.b[:0], p[len(p)-t.max:]...), true
		return n, nil
	}
	if over := len(t.b) + len(p) - t.max; over > 0 {
		t.b, t.cut = append(t.b[:0], t.b[over:]...), true
	}
	t.b = append(t.b, p...)
	return n, nil
}

// String is what was kept, after a line that says what was cut.
func (t *tailBuffer) String() string {
	if !t.cut {
		return string(t.b)
	}
	return fmt.Sprintf("[fogdeploy: earlier output cut: only the last %d bytes are read]\n", t.max) + string(t.b)
}
