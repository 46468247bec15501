// Where the node reaches an instance of the light container without the runtime's published
// ports: the container's own address, and the container port of each of the app's ports.

package drivers

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// Targets implements Targeter: for each TCP port of h ("6379/tcp"), the
// container's own address and the container port published for it (an
// app's own port, or the generic port of the spare slot it took, which
// the slot redirects to the app's).
func (c *Container) Targets(ctx context.Context, h Handle) (map[string]netip.AddrPort, error) {
	// The runtime's own view: its published ports (the state cut short
	// by a live pid has none).
	st, err := c.RT.Inspect(ctx, h.Ref)
	if err != nil {
		return nil, err
	}
	addr := st.IP
	if addr == "" {
		addr = h.IP
	}
	ip, err := netip.ParseAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: container %s has no address of its own (%q)", ErrDriver, h.Ref, addr)
	}
	out := map[string]netip.AddrPort{}
	for key, addr := range h.Ports {
		if !strings.HasSuffix(key, "/tcp") {
			continue
		}
		host, err := netip.ParseAddrPort(addr)
		if err != nil {
			continue
		}
		for _, p := range st.Ports {
			if p.HostPort == host.Port() && (p.Proto == "" || p.Proto == "tcp") {
				out[key] = netip.AddrPortFrom(ip, p.ContainerPort)
			}
		}
	}
	return out, nil
}
