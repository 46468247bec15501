package frontend

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// ErrKernel wraps every failure to set the kernel's routes.
var ErrKernel = errors.New("front end: kernel routes")

// Kernel forwards, in the kernel, the connections to endpoints whose
// instance runs on this node and takes connections: a destination NAT
// from the front end's address and endpoint port to the instance's own
// address, so that such a connection costs what the node's own published
// ports cost. A port without a kernel route reaches the front end's
// listener, which holds, wakes and forwards it.
type Kernel interface {
	// Set makes the kernel forward exactly routes (endpoint port to the
	// instance's address), in one transaction.
	Set(routes map[int]netip.AddrPort) error
	// Close removes every route.
	Close() error
}

// NFTables is the Kernel of a front end on listen: an nftables table of
// its own (family ip), with destination NAT chains at prerouting (for
// clients of other hosts) and output (for this host's), just before
// the container runtime's published ports.
type NFTables struct {
	listen netip.Addr
	name   string

	mu      sync.Mutex
	made    bool
	current map[int]netip.AddrPort
}

// kernelPriority is just before the destination NAT of dockerd's
// published ports (-100): the first NAT of a connection is the one it
// keeps.
var kernelPriority = nftables.ChainPriorityRef(-101)

// NewNFTables is the kernel routes of a front end listening on listen (an
// IPv4 address). Its table is named after the address, so that several
// front ends of one machine (a dev PoP) keep theirs apart; a table left
// by a killed agent is replaced at the first Set.
func NewNFTables(listen string) (*NFTables, error) {
	a, err := netip.ParseAddr(listen)
	if err != nil || !a.Is4() {
		return nil, fmt.Errorf("%w: %q is not an IPv4 address (the kernel path is IPv4 only; the front end's listener serves the rest)", ErrKernel, listen)
	}
	return &NFTables{listen: a, name: "fogdeploy-frontend-" + strings.ReplaceAll(a.String(), ".", "-")}, nil
}

func (k *NFTables) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyIPv4, Name: k.name}
}

func (k *NFTables) chains(t *nftables.Table) []*nftables.Chain {
	return []*nftables.Chain{
		{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: kernelPriority},
		{Name: "output", Table: t, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: kernelPriority},
	}
}

// Set implements Kernel. An unchanged set sends nothing.
func (k *NFTables) Set(routes map[int]netip.AddrPort) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.made && equalRoutes(k.current, routes) {
		return nil
	}
	for p, to := range routes {
		if p < 1 || p > 65535 || !to.Addr().Is4() || to.Port() == 0 {
			return fmt.Errorf("%w: port %d to %s: want a TCP port and an IPv4 address and port", ErrKernel, p, to)
		}
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("%w: netlink: %w", ErrKernel, err)
	}
	defer func() { _ = c.CloseLasting() }()
	t := k.table()
	chains := k.chains(t)
	if !k.made {
		// A table a killed agent left goes first: its routes may be stale.
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
		for _, ch := range chains {
			c.AddChain(ch)
		}
	} else {
		for _, ch := range chains {
			c.FlushChain(ch)
		}
	}
	ports := make([]int, 0, len(routes))
	for p := range routes {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	for _, ch := range chains {
		for _, p := range ports {
			c.AddRule(k.dnat(t, ch, p, routes[p]))
		}
	}
	if err := c.Flush(); err != nil {
		k.made = false // made anew at the next Set
		return fmt.Errorf("%w: %w", ErrKernel, err)
	}
	k.made = true
	k.current = make(map[int]netip.AddrPort, len(routes))
	for p, to := range routes {
		k.current[p] = to
	}
	return nil
}

// dnat is the rule: ip daddr listen tcp dport port dnat to to.
func (k *NFTables) dnat(t *nftables.Table, ch *nftables.Chain, port int, to netip.AddrPort) *nftables.Rule {
	dst, addr := k.listen.As4(), to.Addr().As4()
	return &nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst[:]},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
		&expr.Immediate{Register: 1, Data: addr[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(to.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}}
}

// Close implements Kernel: the table goes.
func (k *NFTables) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("%w: netlink: %w", ErrKernel, err)
	}
	defer func() { _ = c.CloseLasting() }()
	t := k.table()
	c.AddTable(t)
	c.DelTable(t)
	k.made, k.current = false, nil
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%w: %w", ErrKernel, err)
	}
	return nil
}

// Routes are the routes the kernel holds now, read back from its table.
func (k *NFTables) Routes() (map[int]netip.AddrPort, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("%w: netlink: %w", ErrKernel, err)
	}
	defer func() { _ = c.CloseLasting() }()
	t := k.table()
	rs, err := c.GetRules(t, k.chains(t)[0])
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrKernel, err)
	}
	out := map[int]netip.AddrPort{}
	for _, r := range rs {
		var port int
		var addr netip.Addr
		var to uint16
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Cmp:
				if len(e.Data) == 2 {
					port = int(binaryutil.BigEndian.Uint16(e.Data))
				}
			case *expr.Immediate:
				switch len(e.Data) {
				case 4:
					addr = netip.AddrFrom4([4]byte(e.Data))
				case 2:
					to = binaryutil.BigEndian.Uint16(e.Data)
				}
			}
		}
		out[port] = netip.AddrPortFrom(addr, to)
	}
	return out, nil
}

func equalRoutes(a, b map[int]netip.AddrPort) bool {
	if len(a) != len(b) {
		return false
	}
	for p, to := range a {
		if b[p] != to {
			return false
		}
	}
	return true
}
