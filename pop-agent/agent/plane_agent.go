// The agent's side of the control-plane fence (plane.go): its node record
// with the fence in it, what it does when the fence changes, and the 503
// of /healthz while fenced.

package agent

import (
	"context"
	"maps"
	"net/http"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// nodeRecord is the node's record in etcd: with ProblemControlPlane while
// fenced.
func (a *agent) nodeRecord() state.Node {
	n := a.node
	n.Problems = maps.Clone(a.node.Problems)
	if err := a.plane.err(); err != nil {
		if n.Problems == nil {
			n.Problems = map[string]string{}
		}
		n.Problems[state.ProblemControlPlane] = hint.Sentence(err)
	}
	return n
}

// fenceChanged writes the node's record with its fence (or without), so
// that `fogctl node ls` shows it.
func (a *agent) fenceChanged(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, a.etcdTimeout())
	defer cancel()
	err := a.st.UpdateNode(ctx, a.nodeRecord(), a.session())
	if err != nil {
		// The lease may be gone with the etcd that held it (registering
		// again makes a new one): the record alone.
		err = a.st.UpdateNode(ctx, a.nodeRecord(), nil)
	}
	if err != nil {
		a.log.Warn("control plane: writing the node's record; written again when the node registers", "err", err)
	}
}

// nodeRecords is what the reconciler asks of the node's deployer (a.recs
// in unit tests).
type nodeRecords interface {
	List() ([]deploy.Deployment, error)
	Load(id string) (deploy.Deployment, error)
	Alive(ctx context.Context, id string) (bool, error)
	Undeploy(ctx context.Context, id string) error
	CutOff(ctx context.Context, id string) error
}

// records is the node's deployer as the reconciler asks it.
func (a *agent) records() nodeRecords {
	if a.recs != nil {
		return a.recs
	}
	return nodeDeployer{a.d, a.d.Records()}
}

// nodeDeployer is the deployer with its records, as the reconciler asks
// them.
type nodeDeployer struct {
	*deploy.Deployer
	*deploy.Records
}

// statusWriter answers with code instead of 200 (/healthz of a fenced
// agent).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w statusWriter) WriteHeader(code int) {
	if code == http.StatusOK {
		code = w.code
	}
	w.ResponseWriter.WriteHeader(code)
}
