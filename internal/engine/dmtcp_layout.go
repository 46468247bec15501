// Where the paths of one DMTCP instance are, as its sandbox and its app see them.

package engine

import (
	"fmt"
	"os"
	"path/filepath"
)

// layout names the paths of one instance. ns* paths are as seen inside the
// sandbox's mount namespace (not chrooted); app* paths as the app sees them.
type dmtcpLayout struct {
	inst                string
	nsCkpt, appCkpt     string
	appTmp              string
	nsImg, appImg       string
	mkdirs              []string
	root, prefix, image string
	// coordCkpt and coordTmp are the coordinator's checkpoint and
	// temporary directories as it sees them (chrooted into a root, the
	// app's paths).
	coordCkpt, coordTmp string
	// sh is the wrapper's path in the root: a static busybox bound
	// read-only, the parent of dmtcp_launch and dmtcp_restart inside the
	// app's PID namespace ("" without a root).
	sh, shSrc string
}

// Paths of a root's instance beside rootCkptDir: the coordinator's
// temporary directory, the wrapper.
const (
	rootCoordTmpDir = rootStateDir + "/coord"
	rootShell       = rootStateDir + "/sh"
)

func (d *DMTCP) layout(inst, root, prefix, imgDir string) dmtcpLayout {
	l := dmtcpLayout{inst: inst, root: root, prefix: prefix, image: imgDir}
	if root == "" {
		l.nsCkpt = filepath.Join(inst, "ckpt")
		l.appCkpt, l.coordCkpt = l.nsCkpt, l.nsCkpt
		l.appTmp = filepath.Join(inst, "tmp")
		l.coordTmp = l.appTmp
		l.nsImg, l.appImg = imgDir, imgDir
		return l
	}
	l.nsCkpt = filepath.Join(root, rootCkptDir)
	l.appCkpt, l.coordCkpt = rootCkptDir, rootCkptDir
	l.appTmp, l.coordTmp = rootTmpDir, rootCoordTmpDir
	l.sh, l.shSrc = rootShell, d.tools.busybox
	l.mkdirs = []string{rootCkptDir, rootTmpDir, rootImgDir, rootCoordTmpDir}
	if imgDir != "" {
		l.nsImg, l.appImg = filepath.Join(root, rootImgDir), rootImgDir
	}
	return l
}

func (l dmtcpLayout) sandboxSpec(netNS, confine bool) sandboxSpec {
	spec := sandboxSpec{mountNS: true, netNS: netNS, root: l.root, mkdirs: l.mkdirs, confine: confine}
	if l.root != "" {
		spec.binds = append(spec.binds, bindMount{src: l.prefix, dst: filepath.Join(l.root, l.prefix), ro: true, mkdir: true})
		if l.image != "" {
			spec.binds = append(spec.binds, bindMount{src: l.image, dst: l.nsImg, ro: true})
		}
		spec.binds = append(spec.binds, bindMount{src: l.shSrc, dst: filepath.Join(l.root, l.sh), ro: true, file: true})
	}
	return spec
}

// newInstance makes the per-instance state directory.
func (d *DMTCP) newInstance(l func(inst string) dmtcpLayout) (dmtcpLayout, error) {
	inst, err := os.MkdirTemp(d.cfg.TempDir, "fogdeploy-dmtcp-")
	if err != nil {
		return dmtcpLayout{}, fmt.Errorf("instance directory: %w", err)
	}
	lay := l(inst)
	for _, dir := range []string{filepath.Join(inst, "tmp"), filepath.Join(inst, "ckpt")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			os.RemoveAll(inst)
			return dmtcpLayout{}, err
		}
	}
	return lay, nil
}

// isSystemPrefix reports prefixes that cannot be bound over the same path in
// a root without hiding the root's own files.
func isSystemPrefix(p string) bool {
	switch filepath.Clean(p) {
	case "/", "/usr", "/usr/local", "/bin", "/lib", "/opt":
		return true
	}
	return false
}
