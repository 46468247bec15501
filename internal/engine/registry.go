package engine

import (
	"slices"
	"strings"
)

// Facts are what the rest of the project may know of an engine, written
// here once: adding an engine adds its implementation and one entry of
// the registry below, and every list of engines (the apps' valid engines,
// the spare slots kept, mode auto's order, the light container's flags)
// follows.
type Facts struct {
	Name Name
	// LazyRestore: it restores an app before its memory is read (an app
	// spec's `lazy`).
	LazyRestore bool
	// RemotePages: a lazy restore of its images can read their memory
	// from a page server on another node (OpenPages serves it), so that
	// only the rest of an image moves before the app runs.
	RemotePages bool
	// Compression: it writes gzip-compressed images (an app spec's
	// `compression: gzip`).
	Compression bool
	// SpareSlots: the light container keeps spare slots (made for no
	// app) that its restores take.
	SpareSlots bool
	// ImageFiles is the glob of the files that hold an image's memory.
	ImageFiles string
	// DumpsFromOutside: a process outside the app (criu, run by the light
	// container's PID 1) stops, dumps and restores the app's processes;
	// its container needs the capabilities, devices and mounts of that
	// (runtime.CRIUCapabilities). Otherwise the checkpoint code runs in
	// the app's own processes, with a coordinator (DMTCP): the container
	// needs nothing beyond an app's user switch.
	DumpsFromOutside bool
	// KernelCheck: the engine's own check of the kernel's features must
	// pass in a container with its capabilities before its apps run there
	// (`criu check`).
	KernelCheck bool
	// New makes the engine (on the host: the host driver's).
	New func(Config) Engine
}

// registry lists the engines, in the order mode auto tries them.
var registry = []Facts{
	{Name: NameDMTCP, Compression: true, SpareSlots: true, ImageFiles: "ckpt_*.dmtcp", New: func(c Config) Engine { return NewDMTCP(c) }},
	{Name: NameCRIU, LazyRestore: true, RemotePages: true, SpareSlots: true, ImageFiles: "pages-*.img", DumpsFromOutside: true, KernelCheck: true, New: func(c Config) Engine { return NewCRIU(c) }},
}

// Default is the engine of an app spec that names none: the registry's
// first.
func Default() Name { return registry[0].Name }

// Of is engine name's facts; the zero Facts (no capability) for an engine
// the project does not have.
func Of(name Name) Facts {
	f, _ := Lookup(name)
	return f
}

// ImageLabel is the label of a light container image that carries engine
// name, with its version as the value.
func ImageLabel(name Name) string { return "io.fogdeploy." + string(name) + ".version" }

// All makes every engine of the registry, with cfg.
func All(cfg Config) []Engine {
	out := make([]Engine, 0, len(registry))
	for _, f := range registry {
		out = append(out, f.New(cfg))
	}
	return out
}

// Registry is every engine's facts, in the order mode auto tries them.
func Registry() []Facts { return slices.Clone(registry) }

// Names are the engines' names, in the registry's order.
func Names() []Name {
	out := make([]Name, 0, len(registry))
	for _, f := range registry {
		out = append(out, f.Name)
	}
	return out
}

// Lookup is engine name's facts; false for an engine the project does not
// have.
func Lookup(name Name) (Facts, bool) {
	for _, f := range registry {
		if f.Name == name {
			return f, true
		}
	}
	return Facts{}, false
}

// NamesWith are the engines whose facts have, in the registry's order.
func NamesWith(has func(Facts) bool) []Name {
	var out []Name
	for _, f := range registry {
		if has(f) {
			out = append(out, f.Name)
		}
	}
	return out
}

// List says names as "dmtcp or criu" (", " between more).
func List(names []Name) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}
