package engine

import (
	"slices"
	"testing"
)

// The registry: each engine once, each made by its New under its own
// name, the lists of engines that can do a thing drawn from it.
func TestRegistry(t *testing.T) {
	names := Names()
	if !slices.Equal(names, []Name{NameDMTCP, NameCRIU}) {
		t.Errorf("Names = %v; want dmtcp, then criu (mode auto's order)", names)
	}
	seen := map[Name]bool{}
	for _, f := range Registry() {
		if seen[f.Name] {
			t.Errorf("engine %s registered twice", f.Name)
		}
		seen[f.Name] = true
		if f.New == nil || f.ImageFiles == "" {
			t.Errorf("engine %s: no constructor or image files: %+v", f.Name, f)
			continue
		}
		if e := f.New(Config{}); e.Name() != f.Name {
			t.Errorf("engine %s's New makes %s", f.Name, e.Name())
		}
	}
	if got := NamesWith(func(f Facts) bool { return f.LazyRestore }); !slices.Equal(got, []Name{NameCRIU}) {
		t.Errorf("lazy engines = %v; want criu", got)
	}
	if got := NamesWith(func(f Facts) bool { return f.DumpsFromOutside }); !slices.Equal(got, []Name{NameCRIU}) {
		t.Errorf("engines that dump from outside the app = %v; want criu", got)
	}
	if got := NamesWith(func(f Facts) bool { return f.KernelCheck }); !slices.Equal(got, []Name{NameCRIU}) {
		t.Errorf("engines with a kernel check = %v; want criu", got)
	}
	if p := Of("podman"); Default() != NameDMTCP || p.Name != "" || p.New != nil || p.LazyRestore || p.DumpsFromOutside {
		t.Errorf("Default = %s, Of(podman) = %+v; want dmtcp and no facts", Default(), Of("podman"))
	}
	if ImageLabel(NameCRIU) != "io.fogdeploy.criu.version" || ImageLabel(NameDMTCP) != "io.fogdeploy.dmtcp.version" {
		t.Errorf("image labels %s, %s; want the light container image's labels", ImageLabel(NameDMTCP), ImageLabel(NameCRIU))
	}
	if _, ok := Lookup("podman"); ok {
		t.Errorf("Lookup of an engine the project lacks: found")
	}
	if got := List(names); got != "dmtcp or criu" {
		t.Errorf("List = %q", got)
	}
	if got := len(All(Config{})); got != len(names) {
		t.Errorf("All made %d engines; want %d", got, len(names))
	}
}
