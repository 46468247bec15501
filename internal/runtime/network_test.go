package runtime

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	"github.com/docker/docker/api/types/network"
)

// isolated is a network of fogdeploy's, as the drivers name it.
const isolated = NetworkPrefix + "isolated"

// madeTwice is a dockerd on which two processes made the same network at
// once (its check of a duplicate name is not atomic).
type madeTwice struct {
	DockerClient
	nets    []network.Summary
	removed []string
}

func (m *madeTwice) NetworkList(context.Context, network.ListOptions) ([]network.Summary, error) {
	return slices.Clone(m.nets), nil
}

func (m *madeTwice) NetworkRemove(_ context.Context, id string) error {
	m.removed = append(m.removed, id)
	m.nets = slices.DeleteFunc(m.nets, func(n network.Summary) bool { return n.ID == id })
	return nil
}

func (m *madeTwice) NetworkInspect(_ context.Context, name string, _ network.InspectOptions) (network.Inspect, error) {
	return network.Inspect{Name: name, Options: map[string]string{"com.docker.network.bridge.enable_icc": "false"}}, nil
}

// TestNetworkMadeTwice: of a network made twice at once, the one of the
// lowest ID is kept and the other removed (every process that finds both
// keeps the same one); a network whose name only contains the name stays.
func TestNetworkMadeTwice(t *testing.T) {
	api := &madeTwice{nets: []network.Summary{{ID: "b2", Name: isolated}, {ID: "a1", Name: isolated}, {ID: "c3", Name: isolated + "-other"}}}
	if err := NewDocker(api, slog.New(slog.DiscardHandler)).ensureNetwork(context.Background(), isolated, false); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(api.removed, []string{"b2"}) {
		t.Errorf("removed %v; want [b2], the later of the two", api.removed)
	}
}
