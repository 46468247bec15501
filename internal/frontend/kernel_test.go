package frontend

import (
	"bufio"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestNFTables: the kernel routes of a front end forward a connection to
// its endpoint port with no listener there, read back as they were set;
// an empty set, or Close, leaves the port to whoever listens (here no
// one: refused); a table a killed agent left is replaced.
func TestNFTables(t *testing.T) {
	testenv.NeedRoot(t)
	up, _ := echo(t, "kernel")
	to := netip.MustParseAddrPort(up)
	port := freePorts(t, 1)[0]
	k, err := NewNFTables("127.0.0.77")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Close() })
	if err := k.Set(map[int]netip.AddrPort{port: to}); err != nil {
		t.Fatalf("Set: %v", err)
	}
	addr := "127.0.0.77:" + strconv.Itoa(port)
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("through the kernel route: %v", err)
	}
	if got := ask(t, c, bufio.NewReader(c), "hi"); got != "kernel:hi" {
		t.Errorf("through the kernel route: %q; want kernel:hi", got)
	}
	c.Close()
	if got, err := k.Routes(); err != nil || len(got) != 1 || got[port] != to {
		t.Errorf("Routes = %v, %v; want %d -> %s", got, err, port, to)
	}
	// A second front end's table, as a killed agent's left behind, is
	// replaced whole by a new one's first Set.
	again, _ := NewNFTables("127.0.0.77")
	if err := again.Set(map[int]netip.AddrPort{}); err != nil {
		t.Fatal(err)
	}
	if got, err := k.Routes(); err != nil || len(got) != 0 {
		t.Errorf("after a new front end's first Set: %v, %v; want no route", got, err)
	}
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Errorf("a port without a kernel route and without a listener accepted")
	}
	if _, err := NewNFTables("::1"); err == nil {
		t.Errorf("an IPv6 listen address: want refused")
	}
	if err := again.Set(map[int]netip.AddrPort{0: to}); err == nil {
		t.Errorf("port 0: want refused")
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.Routes(); len(got) != 0 {
		t.Errorf("Routes after Close: %v; want none", got)
	}
}
