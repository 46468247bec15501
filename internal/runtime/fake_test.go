package runtime_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/runtime"
	"github.com/fogdeploy/fogdeploy/internal/runtime/runtimetest"
)

const fakeImage = "fogdeploy-test/busybox:1"

func fakeHarness(opts ...runtime.FakeOption) func(t *testing.T) runtimetest.Harness {
	return func(t *testing.T) runtimetest.Harness {
		f := runtime.NewFake(opts...)
		f.AddImage(fakeImage, runtime.FakeBusybox(), []string{"sh"})
		return runtimetest.Harness{Runtime: f, Image: fakeImage}
	}
}

func TestFakeSuite(t *testing.T) {
	runtimetest.RunSuite(t, fakeHarness())
}

func TestFakeSuiteWithoutBridge(t *testing.T) {
	runtimetest.RunSuite(t, fakeHarness(runtime.FakeWithoutBridge()))
}

func TestFakeWithoutBridgeRefusesPorts(t *testing.T) {
	f := runtime.NewFake(runtime.FakeWithoutBridge())
	f.AddImage(fakeImage, runtime.FakeBusybox(), nil)
	_, err := f.Create(context.Background(), runtime.Spec{Image: fakeImage, Cmd: []string{"sleep", "1"},
		Ports: []runtime.Port{{ContainerPort: 80}}})
	if !errors.Is(err, runtime.ErrNoNetwork) {
		t.Fatalf("Create with ports on a bridgeless daemon: %v, want ErrNoNetwork", err)
	}
}

func TestFakeImportsBusyboxTar(t *testing.T) {
	f := runtime.NewFake()
	// The fake never runs the binary, so any file stands in for busybox.
	if err := runtimetest.ImportBusybox(context.Background(), f, fakeImage, "/proc/self/exe"); err != nil {
		t.Fatal(err)
	}
	runtimetest.RunSuite(t, func(t *testing.T) runtimetest.Harness {
		return runtimetest.Harness{Runtime: f, Image: fakeImage}
	})
}

func TestFakeImageSuite(t *testing.T) {
	// The fake never runs the binary, so any file stands in for busybox.
	runtimetest.RunImageSuite(t, runtime.NewFake(), "/proc/self/exe")
}
