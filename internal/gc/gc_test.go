package gc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/catalog"
	"github.com/fogdeploy/fogdeploy/internal/spec"

	"github.com/fogdeploy/fogdeploy/internal/gc"
	"github.com/fogdeploy/fogdeploy/internal/state"
	"github.com/fogdeploy/fogdeploy/internal/state/statetest"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
	"github.com/fogdeploy/fogdeploy/rbd-layering/fakestore"
)

func TestGCFake(t *testing.T) {
	s, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	testGC(t, s)
}

// testGC builds a pool and a PoP state with one of each kind of leftover
// next to things that must stay, and checks the plan and what Apply does.
func testGC(t *testing.T, s layering.Store) {
	ctx := context.Background()
	st := statetest.Store(t)
	sess, err := st.Register(ctx, state.Node{Name: "gc-n1", Capacity: 4}, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	sfx := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	app := "gcapp" + sfx
	const mib = 1 << 20
	mk := func(name string, meta map[string]string) {
		t.Helper()
		if err := s.Create(ctx, name, 4*mib); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMeta(ctx, name, meta); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Remove(context.Background(), name) })
	}
	// Generations 1-4 of app, sealed; 5 never sealed.
	for g := 1; g <= 5; g++ {
		env, ckpt := catalog.GenImage(app, g, "env"), catalog.GenImage(app, g, "ckpt")
		mk(env, map[string]string{catalog.MetaNode: "gc-n1"})
		mk(ckpt, map[string]string{catalog.MetaNode: "gc-n1"})
		if g == 5 {
			continue
		}
		gen := spec.Generation{App: app, Gen: g, EnvSnap: layering.SnapRef{Image: env, Snap: layering.SealedSnap},
			CkptSnap: layering.SnapRef{Image: ckpt, Snap: layering.SealedSnap}, Engine: "dmtcp"}
		for _, ref := range []layering.SnapRef{gen.EnvSnap, gen.CkptSnap} {
			if err := s.Snapshot(ctx, ref); err != nil {
				t.Fatal(err)
			}
		}
		raw, _ := json.Marshal(gen)
		if err := s.SetMeta(ctx, ckpt, map[string]string{catalog.MetaGeneration: string(raw)}); err != nil {
			t.Fatal(err)
		}
		if err := st.PutCheckpoint(ctx, gen); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateApp(ctx, spec.App{Name: app, Env: "e", Command: []string{"x"}, Ready: spec.Readiness{Kind: spec.ReadyOutput, Phrase: "up"}}, false); err != nil {
		t.Fatal(err)
	}
	// A deployment restored from generation 1: its clone keeps it.
	used := catalog.InstancePrefix + "gc-used" + sfx + "-ckpt"
	if err := s.Clone(ctx, layering.SnapRef{Image: catalog.GenImage(app, 1, "ckpt"), Snap: layering.SealedSnap}, used); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background(), used) })
	_ = s.SetMeta(ctx, used, map[string]string{catalog.MetaNode: "gc-n1", catalog.MetaDeployment: "gc-used" + sfx})
	if err := st.CreateDeployment(ctx, state.Desired{ID: "gc-used" + sfx, App: app, Node: "gc-n1"}); err != nil {
		t.Fatal(err)
	}
	// An orphan clone of this PoP, and one made by a node of another PoP.
	orphan := catalog.InstancePrefix + "gc-gone" + sfx + "-env"
	mk(orphan, map[string]string{catalog.MetaNode: "gc-n1", catalog.MetaDeployment: "gc-gone" + sfx})
	foreign := catalog.InstancePrefix + "gc-foreign" + sfx + "-env"
	mk(foreign, map[string]string{catalog.MetaNode: "elsewhere", catalog.MetaDeployment: "gc-foreign" + sfx})
	// The nodes' read-only copies of generation 3's environment: a Ready
	// node's stays, a NotReady node's goes.
	down, err := st.Register(ctx, state.Node{Name: "gc-n2", Capacity: 4}, 5)
	if err != nil {
		t.Fatal(err)
	}
	down.Close()
	liveCopy, downCopy := catalog.LowerImage(app, 3, "gc-n1"), catalog.LowerImage(app, 3, "gc-n2")
	mk(liveCopy, map[string]string{catalog.MetaNode: "gc-n1", catalog.MetaLower: app + "/3"})
	mk(downCopy, map[string]string{catalog.MetaNode: "gc-n2", catalog.MetaLower: app + "/3"})
	// Pool slots' clones: a NotReady node's idle slot goes; its slot that
	// a pool hit bound (the deployment's status names it) and a Ready
	// node's slot stay.
	idleSlot, boundSlot, liveSlot := catalog.InstancePrefix+"s-idle"+sfx+"-env", catalog.InstancePrefix+"s-bound"+sfx+"-env", catalog.InstancePrefix+"s-live"+sfx+"-env"
	mk(idleSlot, map[string]string{catalog.MetaNode: "gc-n2", catalog.MetaSlot: "s-idle" + sfx})
	mk(boundSlot, map[string]string{catalog.MetaNode: "gc-n2", catalog.MetaSlot: "s-bound" + sfx})
	mk(liveSlot, map[string]string{catalog.MetaNode: "gc-n1", catalog.MetaSlot: "s-live" + sfx})
	if err := st.CreateDeployment(ctx, state.Desired{ID: "gc-hit" + sfx, App: app, Node: "gc-n2"}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetStatus(ctx, "gc-hit"+sfx, state.Status{Instance: spec.Instance{Phase: spec.PhaseRunning, Node: "gc-n2", Pool: "hit", Slot: "s-bound" + sfx}}); err != nil {
		t.Fatal(err)
	}
	// A NotReady node with a deployment that has no status: its pool slot
	// is listed as kept, with the deployment that may hold it.
	unsureNode, err := st.Register(ctx, state.Node{Name: "gc-n3", Capacity: 4}, 5)
	if err != nil {
		t.Fatal(err)
	}
	unsureNode.Close()
	unsureSlot := catalog.InstancePrefix + "s-unsure" + sfx + "-env"
	mk(unsureSlot, map[string]string{catalog.MetaNode: "gc-n3", catalog.MetaSlot: "s-unsure" + sfx})
	if err := st.CreateDeployment(ctx, state.Desired{ID: "gc-nostatus" + sfx, App: app, Node: "gc-n3"}); err != nil {
		t.Fatal(err)
	}
	// Blank filesystems: one no clone uses goes, one a slot's upper
	// image is cloned from stays. (Sizes no other test's pool uses.)
	blankFree, blankUsed := layering.BlankImage(4*mib+int64(len(sfx))*4096+8192), layering.BlankImage(4*mib+int64(len(sfx))*4096+12288)
	for _, b := range []string{blankFree, blankUsed} {
		_ = s.Remove(ctx, b)
		mk(b, nil)
		if err := s.Snapshot(ctx, layering.SnapRef{Image: b, Snap: layering.SealedSnap}); err != nil {
			t.Fatal(err)
		}
	}
	upper := catalog.InstancePrefix + "s-live" + sfx + "-upper"
	if err := s.Clone(ctx, layering.SnapRef{Image: blankUsed, Snap: layering.SealedSnap}, upper); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Remove(context.Background(), upper) })
	_ = s.SetMeta(ctx, upper, map[string]string{catalog.MetaNode: "gc-n1", catalog.MetaSlot: "s-live" + sfx})
	// A throwaway clone that a killed `fogctl env exec` left.
	execClone := layering.ExecPrefix + "gcenv" + sfx + "-dead"
	mk(execClone, nil)
	// A checkpoint record whose images are gone.
	if err := st.PutCheckpoint(ctx, spec.Generation{App: app, Gen: 9, CkptSnap: layering.SnapRef{Image: catalog.GenImage(app, 9, "ckpt")}}); err != nil {
		t.Fatal(err)
	}

	cfg := gc.Config{Store: s, State: st, Keep: 2, Apps: []string{app}}
	plan, err := gc.Plan(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, it := range plan {
		key := it.Kind + " " + it.Name
		if it.Skip {
			key += " (kept)"
		}
		got[key] = it.Reason
		t.Logf("%-40s %s", key, it.Reason)
	}
	for _, want := range []string{
		"generation " + app + "/1 (kept)", // in use
		"generation " + app + "/2",        // beyond the newest 2
		"partial-generation " + app + "/5",
		"clone " + orphan,
		"clone " + downCopy,
		"clone " + idleSlot,
		"checkpoint-record " + app + "/9",
		"clone " + unsureSlot + " (kept)",
		"exec-clone " + execClone,
	} {
		if _, ok := got[want]; !ok {
			t.Errorf("plan lacks %q", want)
		}
	}
	if len(got) != 9 {
		t.Errorf("plan has %d items; want exactly those 9", len(got))
	}
	if why := got["clone "+unsureSlot+" (kept)"]; !strings.Contains(why, "gc-nostatus"+sfx) {
		t.Errorf("the kept slot's reason %q does not name the deployment without a status", why)
	}

	// A young orphan is spared; a held checkpoint lock spares partials.
	young := cfg
	young.MinAge = time.Hour
	if p, _ := gc.Plan(ctx, young); slices.ContainsFunc(p, func(it gc.Item) bool {
		return it.Kind == gc.KindClone || it.Kind == gc.KindPartial || it.Kind == gc.KindExec
	}) {
		t.Errorf("with min-age 1h the plan still removes young images: %+v", p)
	}
	unlock, err := st.LockCheckpoint(ctx, sess, app, true)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := gc.Plan(ctx, cfg); slices.ContainsFunc(p, func(it gc.Item) bool { return it.Kind == gc.KindPartial }) {
		t.Errorf("while the checkpoint lock is held the plan removes the unsealed generation")
	}
	unlock()

	done, err := gc.Apply(ctx, cfg, plan)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 7 {
		t.Errorf("applied %d items; want 7 (the kept generation and slot are not)", len(done))
	}
	exists := func(name string) bool {
		_, err := s.Stat(ctx, name)
		return err == nil
	}
	for _, name := range []string{catalog.GenImage(app, 2, "env"), catalog.GenImage(app, 2, "ckpt"), catalog.GenImage(app, 5, "ckpt"), orphan, downCopy, idleSlot, execClone} {
		if exists(name) {
			t.Errorf("%s is still there", name)
		}
	}
	for _, name := range []string{catalog.GenImage(app, 1, "ckpt"), catalog.GenImage(app, 3, "ckpt"), catalog.GenImage(app, 4, "env"), used, foreign, liveCopy, boundSlot, liveSlot, unsureSlot} {
		if !exists(name) {
			t.Errorf("%s was removed", name)
		}
	}
	// Blank filesystems, with Blanks: the one no clone uses is listed
	// (and not the other, nor one being made); without, neither.
	making := layering.BlankImage(4*mib + int64(len(sfx))*4096 + 16384)
	_ = s.Remove(ctx, making)
	mk(making, nil)
	all := cfg
	all.Blanks = true
	p, err := gc.Plan(ctx, all)
	if err != nil {
		t.Fatal(err)
	}
	var blanks []gc.Item
	for _, it := range p {
		if it.Name == blankFree || it.Name == blankUsed || it.Name == making {
			if it.Kind != gc.KindBlank {
				t.Errorf("%s planned as %s; want %s", it.Name, it.Kind, gc.KindBlank)
			}
			blanks = append(blanks, it)
		}
	}
	if len(blanks) != 1 || blanks[0].Name != blankFree {
		t.Errorf("blank images in the plan: %+v; want %s only", blanks, blankFree)
	}
	if slices.ContainsFunc(plan, func(it gc.Item) bool { return it.Kind == gc.KindBlank }) {
		t.Errorf("a plan without Blanks lists blank images")
	}
	if done, err := gc.Apply(ctx, all, blanks); err != nil || len(done) != len(blanks) {
		t.Errorf("apply the blank items: %v, %v", done, err)
	}
	if exists(blankFree) || !exists(blankUsed) {
		t.Errorf("after gc: unused blank there %v, used blank there %v; want false, true", exists(blankFree), exists(blankUsed))
	}

	recs, _ := st.Checkpoints(ctx, app)
	var gens []int
	for _, r := range recs {
		gens = append(gens, r.Gen)
	}
	if fmt.Sprint(gens) != "[1 3 4]" {
		t.Errorf("checkpoint records = %v; want [1 3 4]", gens)
	}

	// Removals cut short: generation 6 lost its checkpoint image but kept
	// its environment and record; generation 7's environment has neither.
	for g := 6; g <= 7; g++ {
		mk(catalog.GenImage(app, g, "env"), map[string]string{catalog.MetaNode: "gc-n1"})
		if err := s.Snapshot(ctx, layering.SnapRef{Image: catalog.GenImage(app, g, "env"), Snap: layering.SealedSnap}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutCheckpoint(ctx, spec.Generation{App: app, Gen: 6,
		EnvSnap:  layering.SnapRef{Image: catalog.GenImage(app, 6, "env"), Snap: layering.SealedSnap},
		CkptSnap: layering.SnapRef{Image: catalog.GenImage(app, 6, "ckpt"), Snap: layering.SealedSnap}}); err != nil {
		t.Fatal(err)
	}

	// The app is removed from the PoP (its deployment first): its
	// generations go with it, but one that a clone still uses stays.
	for _, id := range []string{"gc-used" + sfx, "gc-hit" + sfx, "gc-nostatus" + sfx} {
		if err := st.DeleteDeployment(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.DeleteApp(ctx, app); err != nil {
		t.Fatal(err)
	}
	plan, err = gc.Plan(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The deployment without a status is gone: so is what held the slot.
	if !slices.ContainsFunc(plan, func(it gc.Item) bool { return it.Name == unsureSlot && !it.Skip }) {
		t.Errorf("once the deployment without a status is undeployed, the plan does not remove its node's pool slot %s", unsureSlot)
	}
	got = map[string]string{}
	for _, it := range plan {
		if it.Kind == gc.KindGeneration || it.Kind == gc.KindPartial {
			key := it.Name
			if it.Skip {
				key += " (kept)"
			}
			got[key] = it.Reason
		}
	}
	want := map[string]string{app + "/1 (kept)": "its app was removed, but 1 clone(s) of it remain",
		app + "/3": "its app was removed", app + "/4": "its app was removed", app + "/6": "its app was removed",
		app + "/7": "its app was removed, and no checkpoint record names it"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("generations in the plan after the app was removed = %v; want %v", got, want)
	}
	if _, err := gc.Apply(ctx, cfg, plan); err != nil {
		t.Fatal(err)
	}
	for _, g := range []int{3, 4, 6, 7} {
		if exists(catalog.GenImage(app, g, "ckpt")) || exists(catalog.GenImage(app, g, "env")) {
			t.Errorf("after gc of the removed app: an image of generation %d is still there", g)
		}
	}
	if !exists(catalog.GenImage(app, 1, "ckpt")) {
		t.Errorf("after gc of the removed app: generation 1 (cloned) was removed")
	}
	if recs, _ := st.Checkpoints(ctx, app); len(recs) != 1 || recs[0].Gen != 1 {
		t.Errorf("checkpoint records after gc of the removed app = %+v; want generation 1 only", recs)
	}
	// Cleanup order: the clone before its parent.
	_ = s.Remove(ctx, used)
}

// An etcd restored from an older backup while the agents were down holds
// none of the deployments and apps made after the backup; their images
// carry their own record that the node held the owner at a revision
// (catalog.MetaEtcd). gc keeps, and lists as kept with why, each image
// whose owner this etcd did not hold at its revision or whose revision it
// has not reached, and still removes an image whose owner it saw removed
// or that carries no such record.
func TestGCKeepsWhatEtcdNeverHeld(t *testing.T) {
	s, st := rollbackPoP(t, "gc-r1")
	ctx := context.Background()
	sfx := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	mk := func(name string, meta map[string]string) {
		t.Helper()
		if err := s.Create(ctx, name, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMeta(ctx, name, meta); err != nil {
			t.Fatal(err)
		}
	}
	gone := "gc-gone" + sfx
	if err := st.CreateDeployment(ctx, state.Desired{ID: gone, App: "web", Node: "gc-r1"}); err != nil {
		t.Fatal(err)
	}
	_, h, err := st.PoP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := strconv.FormatInt(h.Revision, 10)
	if err := st.DeleteDeployment(ctx, gone); err != nil {
		t.Fatal(err)
	}
	if err := st.ForgetStatus(ctx, gone); err != nil {
		t.Fatal(err)
	}
	owner := func(id, rev string) map[string]string {
		m := map[string]string{catalog.MetaNode: "gc-r1", catalog.MetaDeployment: id}
		if rev != "" {
			m[catalog.MetaEtcd] = rev
		}
		return m
	}
	removed, lost, ahead, unstamped := catalog.InstancePrefix+gone+"-env", catalog.InstancePrefix+"gc-lost"+sfx+"-env",
		catalog.InstancePrefix+"gc-ahead"+sfx+"-env", catalog.InstancePrefix+"gc-old"+sfx+"-env"
	mk(removed, owner(gone, held))
	mk(lost, owner("gc-lost"+sfx, held))
	mk(ahead, owner("gc-ahead"+sfx, strconv.FormatInt(h.Revision+1000, 10)))
	mk(unstamped, owner("gc-old"+sfx, ""))
	// A generation of an app this etcd never held at its revision.
	lostApp := "gclost" + sfx
	mk(catalog.GenImage(lostApp, 1, "env"), map[string]string{catalog.MetaNode: "gc-r1"})
	mk(catalog.GenImage(lostApp, 1, "ckpt"), map[string]string{catalog.MetaNode: "gc-r1", catalog.MetaEtcd: held})

	plan, err := gc.Plan(ctx, gc.Config{Store: s, State: st, Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]gc.Item{}
	for _, it := range plan {
		byName[it.Name] = it
	}
	for name, wantKept := range map[string]bool{removed: false, unstamped: false, lost: true, ahead: true, lostApp + "/1": true} {
		it, ok := byName[name]
		switch {
		case !ok:
			t.Errorf("%s is not in the plan: %+v", name, plan)
		case it.Skip != wantKept:
			t.Errorf("%s: kept %v (%s); want kept %v", name, it.Skip, it.Reason, wantKept)
		case wantKept && !strings.Contains(it.Reason, "older backup"):
			t.Errorf("%s is kept for %q; want the reason to name an older backup", name, it.Reason)
		}
	}
	done, err := gc.Apply(ctx, gc.Config{Store: s, State: st, Keep: 1}, plan)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{lost, ahead, catalog.GenImage(lostApp, 1, "ckpt")} {
		if _, err := s.Stat(ctx, name); err != nil {
			t.Errorf("%s after gc: %v; want it kept", name, err)
		}
	}
	for _, name := range []string{removed, unstamped} {
		if _, err := s.Stat(ctx, name); err == nil {
			t.Errorf("%s is still there after gc (%+v)", name, done)
		}
	}
}

// TestGCKeepsWhatTheLastBackupMissed: after `fogctl pop backup`, gc keeps,
// saying why, an orphan made after the backup (an etcd restored from it
// would not know it), and removes one made before it; the snapshot is
// etcd's own, and holds the backup's record.
func TestGCKeepsWhatTheLastBackupMissed(t *testing.T) {
	s, st := rollbackPoP(t, "gc-b1")
	ctx := context.Background()
	if last, err := st.LastBackup(ctx); err != nil || last != nil {
		t.Fatalf("LastBackup before any: %+v, %v; want none", last, err)
	}
	sfx := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	orphan := func(id string) string {
		t.Helper()
		name := catalog.InstancePrefix + id + sfx + "-env"
		if err := s.Create(ctx, name, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := s.SetMeta(ctx, name, map[string]string{catalog.MetaNode: "gc-b1", catalog.MetaDeployment: id + sfx}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	before := orphan("gc-before")
	time.Sleep(1100 * time.Millisecond) // creation times have a second's grain on RBD
	var snap bytes.Buffer
	b, err := st.Snapshot(ctx, &snap)
	if err != nil {
		t.Fatal(err)
	}
	if b.Bytes != int64(snap.Len()) || b.Bytes == 0 || b.Revision == 0 {
		t.Errorf("Snapshot = %+v with %d bytes written; want its size and revision", b, snap.Len())
	}
	if !bytes.Contains(snap.Bytes(), []byte(state.BackupKey)) {
		t.Errorf("the snapshot does not hold the backup's own record %s", state.BackupKey)
	}
	time.Sleep(1100 * time.Millisecond)
	after := orphan("gc-after")

	plan, err := gc.Plan(ctx, gc.Config{Store: s, State: st, Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]gc.Item{}
	for _, it := range plan {
		byName[it.Name] = it
	}
	if it, ok := byName[before]; !ok || it.Skip {
		t.Errorf("an orphan made before the last backup: %+v (in plan %v); want it removed", it, ok)
	}
	if it := byName[after]; !it.Skip || !strings.Contains(it.Reason, "after the PoP's last backup") || !strings.Contains(it.Reason, "fogctl pop backup") {
		t.Errorf("an orphan made after the last backup: %+v; want it kept, naming the backup and how to let gc remove it", it)
	}
	if _, err := gc.Apply(ctx, gc.Config{Store: s, State: st, Keep: 1}, plan); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(ctx, after); err != nil {
		t.Errorf("%s after gc: %v; want it kept", after, err)
	}
	if _, err := s.Stat(ctx, before); err == nil {
		t.Errorf("%s is still there after gc", before)
	}
	// A new backup lets gc remove it.
	if _, err := st.Snapshot(ctx, io.Discard); err != nil {
		t.Fatal(err)
	}
	plan, err = gc.Plan(ctx, gc.Config{Store: s, State: st, Keep: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range plan {
		if it.Name == after && it.Skip {
			t.Errorf("after a new backup, %s is still kept: %s", after, it.Reason)
		}
	}
}

// rollbackPoP is a fake pool and an embedded etcd with the PoP's record
// and node registered, for the rollback tests.
func rollbackPoP(t *testing.T, node string) (*fakestore.Store, *state.Store) {
	t.Helper()
	s, err := fakestore.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	st := statetest.Store(t)
	sess, err := st.Register(ctx, state.Node{Name: node, Capacity: 4}, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	if _, _, err := st.EnsurePoP(ctx); err != nil {
		t.Fatal(err)
	}
	return s, st
}
