package placement

import (
	"fmt"
	"sort"
)

// Names of the policies (pop.placement).
const (
	NameLocality = "locality"
	NameSpread   = "spread"
)

// ByName is the policy of that name; false for none.
func ByName(name string) (Policy, bool) {
	switch name {
	case NameLocality, "":
		return LocalityFirst{}, true
	case NameSpread:
		return Spread{}, true
	}
	return nil, false
}

// LocalityFirst ranks by locality (paper 002): first a node with an idle
// warm-pool slot of the app (the most idle slots first), then a node that
// holds the app's newest generation's checkpoint (its restore fetches
// nothing; one with an idle spare slot too first), then a node with an
// idle spare slot (its restore makes no slot), then the best Score (ties:
// the lexically first name). The PoP's default.
type LocalityFirst struct{}

// Place implements Policy.
func (LocalityFirst) Place(app string, nodes []Node) (Decision, error) {
	cs, err := Eligible(app, nodes)
	if err != nil {
		return Decision{}, err
	}
	sort.SliceStable(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if (a.Locality.Idle > 0) != (b.Locality.Idle > 0) {
			return a.Locality.Idle > 0
		}
		if a.Locality.Idle != b.Locality.Idle {
			return a.Locality.Idle > b.Locality.Idle
		}
		if a.Locality.Local != b.Locality.Local {
			return a.Locality.Local
		}
		if a.Locality.Spare != b.Locality.Spare {
			return a.Locality.Spare
		}
		return better(a, b)
	})
	c := cs[0]
	switch l := c.Locality; {
	case l.Idle > 0:
		return Decision{Node: c.Name, Reason: fmt.Sprintf("pool: %d idle slot(s) of %s on %s", l.Idle, app, c.Name)}, nil
	case l.Local && l.Spare:
		return Decision{Node: c.Name, Reason: fmt.Sprintf("local: no node has an idle pool slot of %s; %s holds its checkpoint and an idle spare slot (score %.0f)", app, c.Name, c.Score())}, nil
	case l.Local:
		return Decision{Node: c.Name, Reason: fmt.Sprintf("local: no node has an idle pool slot of %s; %s holds its checkpoint (score %.0f)", app, c.Name, c.Score())}, nil
	case l.Spare:
		return Decision{Node: c.Name, Reason: fmt.Sprintf("spare: no node has an idle pool slot or the checkpoint of %s; %s has an idle spare slot (score %.0f)", app, c.Name, c.Score())}, nil
	}
	return Decision{Node: c.Name, Reason: fmt.Sprintf("capacity: no node has an idle pool slot or the checkpoint of %s; %s has the most room (score %.0f)", app, c.Name, c.Score())}, nil
}

// Spread ranks by Score alone: the most free room, an app's instances
// spread over the PoP, whatever the nodes hold of it ahead (ties: the
// lexically first name). For a PoP whose nodes should fill evenly.
type Spread struct{}

// Place implements Policy.
func (Spread) Place(app string, nodes []Node) (Decision, error) {
	cs, err := Eligible(app, nodes)
	if err != nil {
		return Decision{}, err
	}
	sort.SliceStable(cs, func(i, j int) bool { return better(cs[i], cs[j]) })
	c := cs[0]
	return Decision{Node: c.Name, Reason: fmt.Sprintf("capacity: %s has the most room for %s (score %.0f)", c.Name, app, c.Score())}, nil
}

// better ranks a before b by Score, then by name.
func better(a, b Node) bool {
	if sa, sb := a.Score(), b.Score(); sa != sb {
		return sa > sb
	}
	return a.Name < b.Name
}
