package cgroup

import (
	"path/filepath"
	"strconv"
)

// ioKnob is one I/O weight file: how a weight is written to it and read
// back from it.
type ioKnob struct {
	file   string
	value  func(w int) string
	weight func(v int) int
}

// The I/O weight files of each version, in the order they are preferred.
var (
	v1IO = []ioKnob{
		{"blkio.weight", func(w int) string { return strconv.Itoa(scale(w, blkioDefault, blkioMin, blkioMax)) },
			func(v int) int { return unscale(v, blkioDefault) }},
		{"blkio.bfq.weight", func(w int) string { return strconv.Itoa(scale(w, bfqDefault, bfqMin, bfqMax)) },
			func(v int) int { return unscale(v, bfqDefault) }},
	}
	v2IO = []ioKnob{
		{"io.weight", func(w int) string { return "default " + strconv.Itoa(w) }, func(v int) int { return v }},
		{"io.bfq.weight", func(w int) string { return "default " + strconv.Itoa(min(w, bfqMax)) }, func(v int) int { return v }},
	}
)

// ioKnobOf returns the first of knobs whose file dir has.
func ioKnobOf(dir string, knobs []ioKnob) (ioKnob, bool) {
	for _, k := range knobs {
		if exists(filepath.Join(dir, k.file)) {
			return k, true
		}
	}
	return ioKnob{}, false
}

// setIO writes I/O weight w to dir's weight file, the first of list it
// has; applied is false where it has none.
func setIO(k *knobs, dir string, list []ioKnob, w int) (applied bool, err error) {
	// One seen in the hierarchy before is written without a look.
	for _, kn := range list {
		if k.known(kn.file) {
			if applied, err = k.write(dir, kn.file, kn.value(w)); applied || err != nil {
				return applied, err
			}
		}
	}
	for _, kn := range list {
		if applied, err = k.write(dir, kn.file, kn.value(w)); applied || err != nil {
			return applied, err
		}
	}
	return false, nil
}

// getIO reads dir's I/O weight, or 0 where it has no weight file.
func getIO(dir string, knobs []ioKnob) (int, error) {
	k, ok := ioKnobOf(dir, knobs)
	if !ok {
		return 0, nil
	}
	v, err := readInt(filepath.Join(dir, k.file))
	if err != nil {
		return 0, err
	}
	return k.weight(v), nil
}
