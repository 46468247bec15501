package agent

import (
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
