// Package placement chooses the node of a deployment: the PoP's placement rules, apart from the
// etcd transactions that commit what they chose (internal/state).
//
// A Policy ranks the candidate nodes of one more instance of an app. Every policy places only on
// a node that is Ready, neither fenced nor cordoned, and below its capacity (Eligible); they differ
// in how they rank those. Choose applies a node pinned by the caller, or the policy.
package placement

import (
	"errors"
	"fmt"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// ErrNoNode: no ready node can take the deployment.
var ErrNoNode = errors.New("no node available")

// ErrFull: a node already has as many deployments as its capacity. The
// errors that wrap it also wrap ErrNoNode.
var ErrFull = errors.New("at capacity")

// Node is what a placement knows of a node, for one app.
type Node struct {
	Name     string
	Capacity int
	Ready    bool
	// Fenced says why the node's agent acts on nothing ("": it acts).
	Fenced string
	// Cordoned says since when and why an operator keeps new work off
	// it ("": it takes work).
	Cordoned string
	// Held is how many deployments it holds, Same how many of them are
	// of the app placed.
	Held, Same int
	// Locality is what it holds of the app ahead of its deploys.
	Locality Locality
}

// Locality is what a node holds of an app ahead of its deploys.
type Locality struct {
	// Idle is its idle warm-pool slots of the app.
	Idle int
	// Local: it holds the app's newest generation's checkpoint.
	Local bool
	// Spare: it has an idle spare slot (made for no app), which a
	// restore of an app that fits one attaches instead of provisioning a
	// slot.
	Spare bool
}

// Decision is where a deployment goes and why.
type Decision struct {
	Node string
	// Reason says why: "requested", "pool: ...", "local: ...",
	// "spare: ..." or "capacity: ...".
	Reason string
}

// Policy places one more instance of app among nodes.
type Policy interface {
	// Place returns the node it ranks first among the Eligible ones, and
	// why; ErrNoNode (with ErrFull when some node is ready and every
	// ready one full) when none is.
	Place(app string, nodes []Node) (Decision, error)
}

// capacity is the number of instances n takes (at least one).
func (n Node) capacity() int {
	if n.Capacity <= 0 {
		return 1
	}
	return n.Capacity
}

// Room reports whether n takes one more instance.
func (n Node) Room() bool { return n.Held < n.capacity() }

// Score rates a node for one more instance of the app: its free capacity
// (in percent), minus a penalty per instance of the same app already
// there, so that an app spreads over the PoP (it may go below zero).
func (n Node) Score() float64 {
	c := n.capacity()
	return 100*float64(c-n.Held)/float64(c) - 25*float64(n.Same)
}

// Eligible returns the nodes a policy may place on (Ready, not fenced, not
// cordoned, with room), or the error that says why there is none.
func Eligible(app string, nodes []Node) ([]Node, error) {
	var out []Node
	ready, capacity, fenced, cordoned := 0, 0, 0, 0
	for _, n := range nodes {
		switch {
		case !n.Ready:
			continue
		case n.Fenced != "":
			fenced++ // its agent acts on nothing: a deployment there would wait
			continue
		case n.Cordoned != "":
			cordoned++ // an operator keeps new work off it
			continue
		}
		ready++
		capacity += n.capacity()
		if n.Room() {
			out = append(out, n)
		}
	}
	switch {
	case ready == 0 && fenced > 0:
		return nil, hint.With(fmt.Errorf("app %s: %w (%d node(s) registered, %d of them ready but fenced: their etcd is not the one they knew)", app, ErrNoNode, len(nodes), fenced),
			"`fogctl node ls` says why each node is fenced")
	case ready == 0 && cordoned > 0:
		return nil, hint.With(fmt.Errorf("app %s: %w (%d node(s) registered, every ready one cordoned or fenced: %d cordoned)", app, ErrNoNode, len(nodes), cordoned),
			"`fogctl node uncordon NODE` lets a node take deployments again; `fogctl node ls` shows the nodes")
	case ready == 0:
		return nil, hint.With(fmt.Errorf("app %s: %w (%d node(s) registered, none ready)", app, ErrNoNode, len(nodes)),
			"`fogctl node ls` shows the nodes; start a pop-agent")
	case len(out) == 0:
		return nil, hint.With(fmt.Errorf("app %s: %w: every ready node is %w (%d of %d registered node(s) ready, capacity %d in all)",
			app, ErrNoNode, ErrFull, ready, len(nodes), capacity),
			"`fogctl ps` lists the deployments: undeploy one with `fogctl undeploy ID`, or start a pop-agent on another node")
	}
	return out, nil
}

// Choose returns pinned when it names a node that is Ready, neither fenced
// nor cordoned, and has room for one more instance of app, or, when
// pinned is "", the node p places it on. A full node is refused with an
// error wrapping ErrFull and ErrNoNode; an unknown one with notFound's.
func Choose(p Policy, app, pinned string, nodes []Node, notFound func(string) error) (Decision, error) {
	if pinned == "" {
		return p.Place(app, nodes)
	}
	for _, n := range nodes {
		if n.Name != pinned {
			continue
		}
		switch {
		case !n.Ready:
			return Decision{}, fmt.Errorf("node %s is NotReady: %w", pinned, ErrNoNode)
		case n.Fenced != "":
			return Decision{}, hint.With(fmt.Errorf("node %s is fenced (its etcd is not the one it knew), and deploys nothing: %w", pinned, ErrNoNode),
				"`fogctl node ls` says why, and what to do")
		case n.Cordoned != "":
			return Decision{}, hint.With(fmt.Errorf("node %s is cordoned %s, and takes no new deployment: %w", pinned, n.Cordoned, ErrNoNode),
				"`fogctl node uncordon "+pinned+"` lets it take deployments again, or deploy without --node")
		case !n.Room():
			return Decision{}, hint.With(fmt.Errorf("app %s: %w: node %s is %w (%d deployment(s), capacity %d)", app, ErrNoNode, pinned, ErrFull, n.Held, n.capacity()),
				"undeploy an instance on "+pinned+" (`fogctl ps` lists them), or deploy without --node to let the PoP place it")
		}
		return Decision{Node: pinned, Reason: "requested: --node " + pinned}, nil
	}
	return Decision{}, notFound(pinned)
}
