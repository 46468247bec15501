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
	appTmp, coordTmp    string
	nsImg, appImg       string
	mkdirs              []string
	root, prefix, image string
}

func (d *DMTCP) layout(inst, root, prefix, imgDir string) dmtcpLayout {
	l := dmtcpLayout{inst: inst, root: root, prefix: prefix, coordTmp: filepath.Join(inst, "tmp"),
		image: imgDir}
	if root == "" {
		l.nsCkpt = filepath.Join(inst, "ckpt")
		l.appCkpt = l.nsCkpt
		l.appTmp = l.coordTmp
		l.nsImg, l.appImg = imgDir, imgDir
		return l
	}
	l.nsCkpt = filepath.Join(root, rootCkptDir)
	l.appCkpt = rootCkptDir
	l.appTmp = rootTmpDir
	l.mkdirs = []string{rootCkptDir, rootTmpDir, rootImgDir}
	if imgDir != "" {
		l.nsImg, l.appImg = filepath.Join(root, rootImgDir), rootImgDir
	}
	return l
}

func (l dmtcpLayout) sandboxSpec(netNS bool) sandboxSpec {
	spec := sandboxSpec{mountNS: true, netNS: netNS, root: l.root, mkdirs: l.mkdirs}
	if l.root != "" {
		spec.binds = append(spec.binds, bindMount{src: l.prefix, dst: filepath.Join(l.root, l.prefix), ro: true, mkdir: true})
		if l.image != "" {
			spec.binds = append(spec.binds, bindMount{src: l.image, dst: l.nsImg, ro: true})
		}
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
	for _, dir := range []string{lay.coordTmp, filepath.Join(inst, "ckpt")} {
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
