package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// PoP holds what every node of a PoP, and fogctl, must be given alike.
type PoP struct {
	Frontend PoPFrontend `yaml:"frontend"`
	// Placement names the policy that places deployments:
	// locality (the default: a node with the app's pool slots, its
	// checkpoint, a spare slot, then room) or spread (room alone).
	Placement string `yaml:"placement"`
}

// PoPFrontend is the PoP's front end as a whole: where each deployment's
// stable endpoint lies.
type PoPFrontend struct {
	// Ports is the range of the PoP's endpoint ports, "LO-HI" (default
	// 20000-29999), from which each deployment takes one port per TCP
	// port of its app at its creation; "off": no endpoints.
	Ports string `yaml:"ports"`
}

// Frontend is this node's front end (agent.frontend).
type Frontend struct {
	// Listen is the address where the node's front end accepts
	// connections to every endpoint of the PoP ("": the host of
	// agent.advertise, else 127.0.0.1; "off": none on this node).
	Listen string `yaml:"listen"`
	// HoldTimeout bounds how long a connection waits for its instance
	// while it moves, resumes or is woken (default 10s).
	HoldTimeout time.Duration `yaml:"hold_timeout"`
	// MaxHeld bounds the connections held at once (default 1024).
	MaxHeld int `yaml:"max_held"`
	// WakesPerSecond bounds how many Suspended deployments connections
	// may wake through this node, a second (default 5, in bursts of
	// twice as many): a scan of the PoP's ports does not wake it whole.
	WakesPerSecond float64 `yaml:"wakes_per_second"`
	// Kernel: connections to an endpoint whose instance runs on this node
	// and takes connections are forwarded by the kernel (a destination NAT
	// in an nftables table of the front end's), not through the front
	// end's process (on by default; IPv4 only).
	Kernel Switch `yaml:"kernel"`
}

// DefaultEndpointPorts is pop.frontend.ports' default.
const DefaultEndpointPorts = "20000-29999"

// PortsOff turns endpoints (pop.frontend.ports) or a node's front end
// (agent.frontend.listen) off.
const PortsOff = "off"

// Range is pop.frontend.ports as its bounds; ok is false when off.
func (p PoPFrontend) Range() (lo, hi int, ok bool, err error) {
	v := strings.TrimSpace(p.Ports)
	if v == PortsOff {
		return 0, 0, false, nil
	}
	a, b, found := strings.Cut(v, "-")
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !found || err1 != nil || err2 != nil || lo < 1024 || hi > 65535 || hi < lo {
		return 0, 0, false, fmt.Errorf("pop.frontend.ports %q: give a range of TCP ports LO-HI within 1024-65535, e.g. %s, outside the node's ephemeral ports (net.ipv4.ip_local_port_range), or off", p.Ports, DefaultEndpointPorts)
	}
	return lo, hi, true, nil
}

// ListenAddress is the address the node's front end listens on, given
// the agent's advertised API address ("" with off).
func (f Frontend) ListenAddress(advertise string) string {
	switch v := strings.TrimSpace(f.Listen); {
	case v == PortsOff:
		return ""
	case v != "":
		return v
	}
	if host, _, err := net.SplitHostPort(advertise); err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
		return host
	}
	return "127.0.0.1"
}

func (f Frontend) validate() []error {
	var errs []error
	if v := strings.TrimSpace(f.Listen); v != "" && v != PortsOff && net.ParseIP(v) == nil {
		errs = append(errs, fmt.Errorf("agent.frontend.listen %q: give an IP address of this node (the ports are pop.frontend.ports), or off", f.Listen))
	}
	if f.HoldTimeout < 0 || f.HoldTimeout > 10*time.Minute {
		errs = append(errs, fmt.Errorf("agent.frontend.hold_timeout %s: give a duration between 0s and 10m, e.g. 10s", f.HoldTimeout))
	}
	if f.MaxHeld < 1 || f.MaxHeld > 1<<20 {
		errs = append(errs, fmt.Errorf("agent.frontend.max_held %d: give how many connections may wait for their deployment at once, 1 to 1048576 (default 1024)", f.MaxHeld))
	}
	if f.WakesPerSecond < 0 || f.WakesPerSecond > 10000 {
		errs = append(errs, fmt.Errorf("agent.frontend.wakes_per_second %v: give 0 (connections wake nothing) to 10000 (default 5)", f.WakesPerSecond))
	}
	return errs
}
