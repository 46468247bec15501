package placement

import (
	"errors"
	"strings"
	"testing"
)

var errUnknown = errors.New("unknown node")

func notFound(n string) error { return errors.New("node " + n + ": " + errUnknown.Error()) }

// placeMany places n instances of app one after the other, as a PoP
// would, and returns how many went to each node.
func placeMany(t *testing.T, p Policy, app string, nodes []Node, n int) (map[string]int, error) {
	t.Helper()
	counts := map[string]int{}
	for range n {
		d, err := p.Place(app, nodes)
		if err != nil {
			return counts, err
		}
		if d.Reason == "" {
			t.Errorf("a placement on %s without a reason", d.Node)
		}
		for i := range nodes {
			if nodes[i].Name == d.Node {
				nodes[i].Held++
				nodes[i].Same++
			}
		}
		counts[d.Node]++
	}
	return counts, nil
}

// TestPolicies is the suite every policy passes: it places only on a Ready
// node that is neither fenced nor cordoned, never beyond a node's
// capacity, says why, and says why it cannot; a pinned node is taken as
// asked, or refused with why.
func TestPolicies(t *testing.T) {
	for name, p := range map[string]Policy{NameLocality: LocalityFirst{}, NameSpread: Spread{}} {
		t.Run(name, func(t *testing.T) { suite(t, p) })
	}
}

func suite(t *testing.T, p Policy) {
	nodes := []Node{{Name: "a", Capacity: 4, Ready: true}, {Name: "b", Capacity: 4, Ready: true}, {Name: "c", Capacity: 4},
		{Name: "f", Capacity: 8, Ready: true, Fenced: "etcd is not the one it knew"}, {Name: "k", Capacity: 8, Ready: true, Cordoned: "since 10:00 (disk)"}}
	counts, err := placeMany(t, p, "web", nodes, 8)
	if err != nil || counts["a"] != 4 || counts["b"] != 4 {
		t.Errorf("8 instances on a and b of capacity 4 (c NotReady, f fenced, k cordoned): %v, %v; want 4 and 4", counts, err)
	}
	if _, err := p.Place("web", nodes); !errors.Is(err, ErrNoNode) || !errors.Is(err, ErrFull) {
		t.Errorf("a 9th instance: %v; want ErrNoNode and ErrFull", err)
	}
	// A lone node takes instances of one app up to its capacity, however
	// low the spreading penalty brings its score.
	solo := []Node{{Name: "solo", Capacity: 8, Ready: true}}
	if counts, err := placeMany(t, p, "web", solo, 8); err != nil || counts["solo"] != 8 {
		t.Errorf("8 instances on a lone node of capacity 8: %v, %v", counts, err)
	}
	for _, tc := range []struct {
		nodes []Node
		want  string
	}{
		{[]Node{{Name: "f", Ready: true, Fenced: "x"}}, "fenced"},
		{[]Node{{Name: "k", Ready: true, Cordoned: "since 10:00"}}, "cordoned"},
		{[]Node{{Name: "c"}}, "none ready"},
	} {
		if _, err := p.Place("web", tc.nodes); !errors.Is(err, ErrNoNode) || errors.Is(err, ErrFull) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Place on %+v: %v; want ErrNoNode saying %q", tc.nodes, err, tc.want)
		}
	}
	// Pinned.
	nodes = []Node{{Name: "a", Capacity: 2, Ready: true, Held: 2}, {Name: "b", Capacity: 4, Ready: true, Locality: Locality{Idle: 1}},
		{Name: "c", Capacity: 4}, {Name: "f", Capacity: 4, Ready: true, Fenced: "x"}, {Name: "k", Capacity: 4, Ready: true, Cordoned: "since 10:00"}}
	if d, err := Choose(p, "web", "b", nodes, notFound); err != nil || d.Node != "b" || !strings.HasPrefix(d.Reason, "requested") {
		t.Errorf("Choose b: %+v, %v; want b, requested", d, err)
	}
	for pinned, want := range map[string]error{"a": ErrFull, "c": ErrNoNode, "f": ErrNoNode, "k": ErrNoNode} {
		if _, err := Choose(p, "web", pinned, nodes, notFound); !errors.Is(err, want) || !strings.Contains(err.Error(), "node "+pinned) {
			t.Errorf("Choose %s: %v; want %v naming it", pinned, err, want)
		}
	}
	if _, err := Choose(p, "web", "zz", nodes, notFound); err == nil || !strings.Contains(err.Error(), errUnknown.Error()) {
		t.Errorf("Choose an unknown node: %v; want notFound's error", err)
	}
}

// LocalityFirst: a node with idle pool slots of the app (the most first)
// wins over one with more room, then one holding its checkpoint (with a
// spare slot first), then one with a spare slot, then room; a full node's
// pool does not make it take more; each reason says which.
func TestLocalityFirst(t *testing.T) {
	base := func(loc map[string]Locality) []Node {
		return []Node{{Name: "a", Capacity: 4, Ready: true, Locality: loc["a"]}, {Name: "b", Capacity: 4, Ready: true, Locality: loc["b"]},
			{Name: "c", Capacity: 4, Ready: true, Held: 2, Locality: loc["c"]}}
	}
	for _, tc := range []struct {
		loc    map[string]Locality
		node   string
		reason string
	}{
		{map[string]Locality{"c": {Idle: 1}, "a": {Local: true}}, "c", "pool:"},
		{map[string]Locality{"b": {Idle: 1}, "c": {Idle: 2}}, "c", "pool:"},
		{nil, "a", "capacity:"},
		{map[string]Locality{"c": {Local: true}}, "c", "local:"},
		{map[string]Locality{"a": {Local: true}, "c": {Local: true, Spare: true}}, "c", "local:"},
		{map[string]Locality{"a": {Local: true}, "c": {Spare: true}}, "a", "local:"},
		{map[string]Locality{"c": {Spare: true}}, "c", "spare:"},
	} {
		d, err := LocalityFirst{}.Place("web", base(tc.loc))
		if err != nil || d.Node != tc.node || !strings.HasPrefix(d.Reason, tc.reason) {
			t.Errorf("with %+v: %+v, %v; want %s, %s", tc.loc, d, err, tc.node, tc.reason)
		}
	}
	full := base(map[string]Locality{"c": {Idle: 1, Local: true}})
	full[2].Held = 4
	if d, err := (LocalityFirst{}).Place("web", full); err != nil || d.Node == "c" {
		t.Errorf("with c full and holding a slot: %+v, %v; want another node", d, err)
	}
}

// Spread ranks by room alone: what a node holds of the app ahead does not
// draw it, and an app's instances spread.
func TestSpread(t *testing.T) {
	nodes := []Node{{Name: "a", Capacity: 4, Ready: true}, {Name: "b", Capacity: 4, Ready: true, Held: 2, Locality: Locality{Idle: 2, Local: true, Spare: true}}}
	if d, err := (Spread{}).Place("web", nodes); err != nil || d.Node != "a" || !strings.HasPrefix(d.Reason, "capacity:") {
		t.Errorf("Spread with b holding slots but less room: %+v, %v; want a", d, err)
	}
	even := []Node{{Name: "a", Capacity: 4, Ready: true}, {Name: "b", Capacity: 4, Ready: true}}
	if counts, err := placeMany(t, Spread{}, "web", even, 6); err != nil || counts["a"] != 3 || counts["b"] != 3 {
		t.Errorf("6 instances on two empty nodes: %v, %v; want 3 and 3", counts, err)
	}
	if p, ok := ByName("spread"); !ok || p != (Spread{}) {
		t.Errorf("ByName(spread) = %v, %v", p, ok)
	}
	if _, ok := ByName("random"); ok {
		t.Errorf("ByName(random): want no such policy")
	}
}
