package testenv

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// EtcdAddr returns 127.0.0.1:P with P and P+1 (the peer port) free,
// below the kernel's range of ephemeral ports: etcd is stopped and started
// again on the same ports, and meanwhile an outgoing connection of any
// process could take a port of that range as its local port.
func EtcdAddr(t testing.TB) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	const base = 20000
	if low-2 <= base {
		t.Fatalf("ephemeral ports start at %d: no room below them for etcd's ports", low)
	}
	for range 50 {
		port := base + rand.IntN(low-2-base)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		peer, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+1))
		l.Close()
		if err == nil {
			peer.Close()
			return "127.0.0.1:" + strconv.Itoa(port)
		}
	}
	t.Fatal("no free pair of ports for etcd")
	return ""
}
