package state

import (
	"errors"
	"fmt"
	"sort"

	"github.com/fogdeploy/fogdeploy/internal/hint"
)

// ErrNoNode: no ready node can take the deployment.
var ErrNoNode = errors.New("no node available")

// Score rates a node for one more instance of app: its free capacity (in
// percent), minus a penalty per instance of the same app already there so
// that an app spreads over the PoP (the score may go below zero). ok is
// false when the node is full. Later work adds locality (layers and
// checkpoints already mapped on the node) as further terms.
func Score(n Node, deps []Deployment, app string) (score float64, ok bool) {
	total, same := 0, 0
	for _, d := range deps {
		if d.Node != n.Name {
			continue
		}
		total++
		if d.App == app {
			same++
		}
	}
	capacity := n.Capacity
	if capacity <= 0 {
		capacity = 1
	}
	if total >= capacity {
		return 0, false
	}
	return 100*float64(capacity-total)/float64(capacity) - 25*float64(same), true
}

// Place picks the ready node with the best Score (ties: the lexically
// first). It returns ErrNoNode when every node is NotReady or full.
func Place(nodes []Node, deps []Deployment, app string) (string, error) {
	type cand struct {
		name  string
		score float64
	}
	var cs []cand
	for _, n := range nodes {
		if !n.Ready {
			continue
		}
		if s, ok := Score(n, deps, app); ok {
			cs = append(cs, cand{n.Name, s})
		}
	}
	if len(cs) == 0 {
		return "", hint.With(fmt.Errorf("app %s: %w (%d node(s) registered, none ready with free capacity)", app, ErrNoNode, len(nodes)),
			"`fogctl node ls` shows the nodes; start a pop-agent or undeploy something")
	}
	sort.SliceStable(cs, func(i, j int) bool {
		if cs[i].score != cs[j].score {
			return cs[i].score > cs[j].score
		}
		return cs[i].name < cs[j].name
	})
	return cs[0].name, nil
}
