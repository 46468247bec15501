// Package netredirect points ports of a network namespace at others: a TCP connection that
// arrives in the namespace for port From is taken by the socket listening on port To (an nftables
// redirect in the namespace's own nat table, made over netlink without entering the namespace). A
// spare instance publishes generic ports; the app that takes it listens on its own. Prepare makes
// the table ahead (what costs the kernel most), Set adds the rules.
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

// Prepare makes the table and chain of the redirects in the network
// namespace of process pid, with a redirect of port Idle onto itself
// (which changes nothing): a namespace's first NAT chain and redirect cost
// the kernel 8-15 ms to hook in (connection tracking), which Prepare pays
// ahead of Set. A second Prepare drops what Set added.
func Prepare(pid int) error {
	return in(pid, func(c *nftables.Conn) {
		t := table()
		c.AddTable(t) // so that the delete below finds one
		c.DelTable(t)
		c.AddTable(t)
		c.AddRule(redirect(t, c.AddChain(chain(t)), Rule{From: Idle, To: Idle}))
	})
}

// Idle is the port of the redirect Prepare makes, onto itself.
const Idle = 1

// Set adds rules to the chain Prepare made in the network namespace of
// process pid, in one netlink transaction; without Prepare it makes the
// table and chain first. Only the rules are sent when the chain is there:
// naming the chain again, even unchanged, makes the kernel hook it in
// anew (10-15 ms here, against under 1 ms for the rules alone).
func Set(pid int, rules []Rule) error {
	for _, r := range rules {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	err := in(pid, func(c *nftables.Conn) {
		t := table()
		ch := chain(t)
		for _, r := range rules {
			c.AddRule(redirect(t, ch, r))
		}
	})
	if !errors.Is(err, unix.ENOENT) {
		return err
	}
	// No table or chain yet (no Prepare): made in the same transaction.
	return in(pid, func(c *nftables.Conn) {
		t := table()
		c.AddTable(t) // no-op if it exists
		ch := c.AddChain(chain(t))
		for _, r := range rules {
			c.AddRule(redirect(t, ch, r))
		}
	})
}

// redirect is the rule of r in chain ch.
func redirect(t *nftables.Table, ch *nftables.Chain, r Rule) *nftables.Rule {
	return &nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.From)},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(r.To)},
		&expr.Redir{RegisterProtoMin: 1},
	}}
}

func table() *nftables.Table { return &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table} }

func chain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest}
}

// in runs batch on a netlink connection in process pid's network
// namespace (opened through /proc; the calling thread stays in its own)
// and flushes it.
func in(pid int, batch func(*nftables.Conn)) error {
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
	batch(c)
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
	t := table()
	rs, err := c.GetRules(t, chain(t))
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
		if len(ports) == 2 && ports[0] != Idle {
			out = append(out, Rule{From: ports[0], To: ports[1]})
		}
	}
	return out, nil
}
