// Package netredirect points ports of a network namespace at others: a TCP connection that
// arrives in the namespace for port From is taken by the socket listening on port To (an nftables
// redirect in the namespace's own nat table, made over netlink without entering the namespace). A
// spare instance publishes generic ports; the app that takes it listens on its own.
package netredirect

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// ErrRedirect wraps every failure to set redirects up.
var ErrRedirect = errors.New("port redirect")

// Table is the nftables table (family ip) the redirects go into.
const Table = "fogdeploy"

// Rule redirects TCP connections to port From to port To.
type Rule struct {
	From, To uint16
}

// Validate checks r.
func (r Rule) Validate() error {
	if r.From == 0 || r.To == 0 {
		return fmt.Errorf("%w: %d -> %d: ports must be 1 to 65535", ErrRedirect, r.From, r.To)
	}
	return nil
}

// Set puts rules into the network namespace of process pid, in one
// netlink transaction: the table is made anew, so that a second Set
// replaces what the first put. The process's namespace is opened through
// /proc; the calling thread stays in its own.
func Set(pid int, rules []Rule) error {
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return fmt.Errorf("%w: network namespace of process %d: %w", ErrRedirect, pid, err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("%w: netlink in the namespace of process %d: %w", ErrRedirect, pid, err)
	}
	defer func() { _ = c.CloseLasting() }()
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table}
	c.AddTable(t) // so that the delete below finds one
	c.DelTable(t)
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.From)},
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.To)},
			&expr.Redir{RegisterProtoMin: 1},
		}})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: in the namespace of process %d: %w", ErrRedirect, pid, err)
	}
	return nil
}

// List returns the redirects Set put into process pid's namespace.
func List(pid int) ([]Rule, error) {
	ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		return nil, fmt.Errorf("%w: network namespace of process %d: %w", ErrRedirect, pid, err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return nil, fmt.Errorf("%w: netlink in the namespace of process %d: %w", ErrRedirect, pid, err)
	}
	defer func() { _ = c.CloseLasting() }()
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table}
	rs, err := c.GetRules(t, &nftables.Chain{Name: "prerouting", Table: t})
	if err != nil {
		return nil, fmt.Errorf("%w: in the namespace of process %d: %w", ErrRedirect, pid, err)
	}
	var out []Rule
	for _, r := range rs {
		var ports []uint16
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Cmp:
				if len(e.Data) == 2 {
					ports = append(ports, binaryutil.BigEndian.Uint16(e.Data))
				}
			case *expr.Immediate:
				if len(e.Data) == 2 {
					ports = append(ports, binaryutil.BigEndian.Uint16(e.Data))
				}
			}
		}
		if len(ports) == 2 {
			out = append(out, Rule{From: ports[0], To: ports[1]})
		}
	}
	return out, nil
}
