// A container's state as the moby API reports it.

package runtime

import (
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"
)

func stateFromInspect(r container.InspectResponse) State {
	st := State{}
	if r.ContainerJSONBase != nil {
		st.ID = r.ID
		st.Name = strings.TrimPrefix(r.Name, "/")
		if r.State != nil {
			st.Status = string(r.State.Status)
			st.Running = r.State.Running
			st.ExitCode = r.State.ExitCode
			st.Pid = r.State.Pid
			st.StartedAt = parseDockerTime(r.State.StartedAt)
			st.FinishedAt = parseDockerTime(r.State.FinishedAt)
		}
		if r.HostConfig != nil {
			st.Network = string(r.HostConfig.NetworkMode)
		}
	}
	if r.NetworkSettings != nil && st.Running {
		if ep := r.NetworkSettings.Networks[st.Network]; ep != nil {
			st.IP = ep.IPAddress
		} else if ep := r.NetworkSettings.Networks[NetworkBridge]; ep != nil && st.Network == "default" {
			st.IP = ep.IPAddress
		}
	}
	if r.Config != nil {
		st.Image = r.Config.Image
		st.Labels = r.Config.Labels
		st.Deployment = r.Config.Labels[LabelDeployment]
		st.App = r.Config.Labels[LabelApp]
	}
	ports := nat.PortMap{}
	if r.NetworkSettings != nil && len(r.NetworkSettings.Ports) > 0 && st.Running {
		ports = r.NetworkSettings.Ports
	} else if r.HostConfig != nil {
		ports = r.HostConfig.PortBindings
	}
	for port, bs := range ports {
		for _, b := range bs {
			hp, _ := strconv.Atoi(b.HostPort)
			st.Ports = append(st.Ports, Port{ContainerPort: uint16(port.Int()), Proto: port.Proto(), HostIP: b.HostIP, HostPort: uint16(hp)})
		}
	}
	sort.Slice(st.Ports, func(i, j int) bool {
		a, b := st.Ports[i], st.Ports[j]
		if a.ContainerPort != b.ContainerPort {
			return a.ContainerPort < b.ContainerPort
		}
		if a.Proto != b.Proto {
			return a.Proto < b.Proto
		}
		return a.HostIP < b.HostIP
	})
	return st
}

func parseDockerTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() <= 1 {
		return time.Time{}
	}
	return t
}
