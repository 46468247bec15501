package mapper

import "testing"

func TestExposes(t *testing.T) {
	img := Image{Pool: "fogdeploy", Name: "fdi-web-1-env"}
	for _, tc := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/usr/bin/rbd-fuse", "-c", "/c", "-p", "fogdeploy", "-r", "fdi-web-1-env", "-f", "/st/fuse/x"}, true},
		{[]string{"rbd-fuse", "--poolname=fogdeploy", "--image=fdi-web-1-env", "/mnt"}, true},
		{[]string{"rbd-fuse", "-p", "fogdeploy", "/mnt"}, true}, // pool-wide: opens every image
		{[]string{"rbd-fuse", "-p", "fogdeploy", "-r", "fdi-web-1-ckpt", "/mnt"}, false},
		{[]string{"rbd-fuse", "-p", "other", "-r", "fdi-web-1-env", "/mnt"}, false},
		{[]string{"rbd-fuse", "-r", "fdi-web-1-env", "/mnt"}, false}, // pool rbd
		{[]string{"rbd-nbd", "map", "fogdeploy/fdi-web-1-env"}, true},
		{[]string{"rbd-nbd", "map", "fogdeploy/fdi-web-1-env@sealed"}, true},
		{[]string{"rbd-nbd", "map", "fogdeploy/fdi-web-1-env2"}, false},
		{[]string{"cat", "-p", "fogdeploy", "-r", "fdi-web-1-env"}, false},
		{nil, false},
	} {
		if got := exposes(tc.argv, img); got != tc.want {
			t.Errorf("exposes(%q) = %v, want %v", tc.argv, got, tc.want)
		}
	}
}
