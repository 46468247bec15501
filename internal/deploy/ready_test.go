package deploy_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/drivers"
	"github.com/fogdeploy/fogdeploy/internal/engine"
)

// listen returns a listener on 127.0.0.1 that answers every connection
// with name and closes it.
func listen(t *testing.T, name string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name + "\n"))
			_ = c.Close()
		}
	}()
	return l
}

func portOf(l net.Listener) string { return strconv.Itoa(l.Addr().(*net.TCPAddr).Port) }

// TestDirectDial: a ready probe reaches the instance at its own address,
// not through the published port (the runtime's proxy); where that address
// does not answer, through the published port; and an app not listening
// yet is not ready, whatever the proxy accepts.
func TestDirectDial(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	instance, proxy := listen(t, "instance"), listen(t, "proxy")
	published := proxy.Addr().String()
	h := drivers.Handle{IP: "127.0.0.1", Ports: map[string]string{portOf(instance) + "/tcp": published}}
	probe := engine.TCPProbe{Addr: published, Expect: "instance", Dial: deploy.DirectDial(h)}
	if err := probe.Probe(ctx); err != nil {
		t.Errorf("probe of an instance with its own address: %v; want it answered by the instance, not the proxy", err)
	}

	// Nothing listens at the instance's own port yet: refused there, not ready.
	closed := listen(t, "gone")
	_ = closed.Close()
	h.Ports = map[string]string{portOf(closed) + "/tcp": published}
	probe.Dial, probe.Expect = deploy.DirectDial(h), ""
	if err := probe.Probe(ctx); err == nil {
		t.Errorf("probe while the app does not listen succeeded (the proxy accepted)")
	}

	// An address the host does not reach (IPv6's discard prefix): the
	// published port.
	h = drivers.Handle{IP: "100::1", Ports: map[string]string{"80/tcp": published}}
	probe = engine.TCPProbe{Addr: published, Expect: "proxy", Dial: deploy.DirectDial(h)}
	for i := range 2 {
		start := time.Now()
		if err := probe.Probe(ctx); err != nil {
			t.Fatalf("probe %d of an unreachable instance address: %v; want the published port's answer", i+1, err)
		}
		if took := time.Since(start); i == 1 && took > 100*time.Millisecond {
			t.Errorf("second probe took %s: the unreachable address was tried again", took)
		}
	}

	// No address of its own: the host's dialer.
	if deploy.DirectDial(drivers.Handle{Ports: h.Ports}) != nil {
		t.Errorf("DirectDial without an address is not nil")
	}
}
