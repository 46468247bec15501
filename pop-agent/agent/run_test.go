package agent

import (
	"net"
	"strings"
	"testing"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// A failure is named after the step that follows the last phase passed.
func TestFailedStep(t *testing.T) {
	phases := func(names ...string) layering.Timings {
		var ts layering.Timings
		for _, n := range names {
			ts = append(ts, layering.Phase{Name: n})
		}
		return ts
	}
	for _, tc := range []struct {
		passed layering.Timings
		want   string
	}{
		{nil, ""},
		{phases("clone"), "map"},
		{phases("clone", "map", "mount", "container"), "start"},
		{phases("clone", "map", "mount", "container", "start"), "ready"},
		{phases("start"), "ready"}, // a pool hit
		{phases("clone", "map", "mount", "container", "start", "ready"), ""},
		{phases("boot.container"), "boot.start"},
		{phases("boot.clone", "boot.map"), "boot.mount"},
		{phases("boot.clone", "boot.map", "boot.mount", "boot.container", "boot.ready"), "boot.checkpoint"},
		{phases("boot.ready", "boot.prepare"), "boot.checkpoint"},
		{phases("boot.checkpoint"), "boot.seal"},
		{phases("boot.seal"), "clone"},
		{phases("boot.seal", "clone", "map"), "mount"},
	} {
		if got := failedStep(tc.passed); got != tc.want {
			t.Errorf("failedStep(%v) = %q; want %q", tc.passed, got, tc.want)
		}
	}
}

// The address an agent registers: the listener's, or agent.advertise;
// never one that names no host.
func TestAdvertised(t *testing.T) {
	lo := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7480}
	anyAddr := &net.TCPAddr{IP: net.IPv4zero, Port: 7480}
	for _, tc := range []struct {
		advertise string
		l         net.Addr
		want      string
		err       string
	}{
		{"", lo, "127.0.0.1:7480", ""},
		{"", anyAddr, "", "needs agent.advertise"},
		{"10.0.0.11:7480", anyAddr, "10.0.0.11:7480", ""},
		{"node1.pop:7480", anyAddr, "node1.pop:7480", ""},
		{"0.0.0.0:7480", anyAddr, "", "this node's own address"},
		{"10.0.0.11", anyAddr, "", "give the host:port"},
	} {
		got, err := advertised(tc.advertise, tc.l)
		if got != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("advertised(%q, %s) = %q, %v; want %q, %q", tc.advertise, tc.l, got, err, tc.want, tc.err)
		}
	}
}
