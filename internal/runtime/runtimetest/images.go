package runtimetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
)

// ImageStore is what RunImageSuite exercises: making, finding and removing
// images on the node.
type ImageStore interface {
	runtime.ImageImporter
	runtime.ImageInspector
}

// RunImageSuite checks that images made with labels are found by label,
// newest first, with their labels, and are gone once removed. busyboxPath
// is the static busybox the images are made of.
func RunImageSuite(t *testing.T, is ImageStore, busyboxPath string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tb, err := BusyboxTar(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	id := randHex(6)
	label := "io.fogdeploy.test." + id
	older, newer, plain := "fogdeploy-suite/labelled:"+id+"-a", "fogdeploy-suite/labelled:"+id+"-b", "fogdeploy-suite/plain:"+id
	for _, ref := range []string{older, newer, plain} {
		t.Cleanup(func() { _ = is.RemoveImage(context.Background(), ref) })
	}
	if err := is.ImportImage(ctx, older, tb, runtime.ImageConfig{Cmd: []string{"/bin/sh"}, Labels: map[string]string{label: "1"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // dockerd dates images to the second
	if err := is.ImportImage(ctx, newer, tb, runtime.ImageConfig{Labels: map[string]string{label: "2", "other": "x y"}}); err != nil {
		t.Fatal(err)
	}
	if err := is.ImportImage(ctx, plain, tb, runtime.ImageConfig{}); err != nil {
		t.Fatal(err)
	}
	found, err := is.FindImages(ctx, label)
	if err != nil {
		t.Fatal(err)
	}
	var refs []string
	for _, im := range found {
		refs = append(refs, im.Ref)
	}
	if len(found) != 2 || found[0].Ref != newer || found[1].Ref != older {
		t.Fatalf("FindImages(%s) = %v, want [%s %s] (newest first, the unlabelled one left out)", label, refs, newer, older)
	}
	if found[0].Labels[label] != "2" || found[0].Labels["other"] != "x y" || found[0].ID == "" || found[0].Created.IsZero() {
		t.Fatalf("newest image: %+v, want labels %s=2 and other=\"x y\", an ID and a creation time", found[0], label)
	}
	labels, err := is.ImageLabels(ctx, older)
	if err != nil || labels[label] != "1" {
		t.Fatalf("ImageLabels(%s) = %v, %v; want %s=1", older, labels, err, label)
	}
	if err := is.ImportImage(ctx, plain, tb, runtime.ImageConfig{Labels: map[string]string{"bad key": "v"}}); !errors.Is(err, runtime.ErrInvalidSpec) {
		t.Fatalf("import with a label key holding a space: %v, want ErrInvalidSpec", err)
	}
	if err := is.RemoveImage(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := is.ImageLabels(ctx, newer); !errors.Is(err, runtime.ErrImageNotFound) {
		t.Fatalf("ImageLabels after RemoveImage: %v, want ErrImageNotFound", err)
	}
	if err := is.RemoveImage(ctx, newer); !errors.Is(err, runtime.ErrImageNotFound) {
		t.Fatalf("second RemoveImage: %v, want ErrImageNotFound", err)
	}
	if found, err := is.FindImages(ctx, label); err != nil || len(found) != 1 || found[0].Ref != older {
		t.Fatalf("FindImages after removing %s: %+v, %v; want only %s", newer, found, err, older)
	}
}
