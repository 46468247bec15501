package deploy_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
	"github.com/fogdeploy/fogdeploy/internal/ksm"
	"github.com/fogdeploy/fogdeploy/internal/spec"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// TestPoolSlotsShareMemory: with Config.MemoryMerge, the slots of an app
// restored ahead on a node share the pages their checkpoint gave them
// all. A prefork app (a parent and three children holding the same
// 16 MiB) is restored ahead into two slots: every process of theirs has
// opted in, the second slot adds at most a quarter of the first one's
// memory once the node's scanner has merged them, and a deploy that takes
// a merged slot answers the checkpoint's digest from every process. A slot
// restored ahead without MemoryMerge, and a restore on demand, do not opt
// in.
func TestPoolSlotsShareMemory(t *testing.T) {
	f := deploytest.NewPythonFixture(t)
	if f.Container == nil || f.Container.Priority == nil {
		testenv.Unavailable(t, testenv.Root, "this machine's cgroups cannot be reweighted: no slot is restored ahead")
	}
	scanner := scannerOn(t)
	merging := f.ReopenWith(t, func(c *deploy.Config) { c.MemoryMerge = true })
	for _, eng := range spec.Engines {
		t.Run(string(eng), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			app, first, want := deployPrefork(ctx, t, f, "merge", eng)
			if pids := appProcs(t, slotProcs(t, f.D, first.ID)); anyMerging(pids) {
				t.Errorf("a restore on demand opted in to same-page merging")
			}
			if err := f.D.Undeploy(ctx, first.ID); err != nil {
				t.Fatal(err)
			}
			g, err := f.D.Checkpoints().Latest(ctx, app.Name)
			if err != nil {
				t.Fatal(err)
			}
			ahead := func(d *deploy.Deployer) deploy.Slot {
				t.Helper()
				s, err := d.Pool().ProvisionPoolSlot(ctx, g)
				if err == nil {
					s, err = d.Pool().StartAhead(ctx, g, s.ID)
				}
				if err != nil {
					t.Fatalf("a slot restored ahead: %v", err)
				}
				return s
			}
			plain := ahead(f.D)
			if anyMerging(appProcs(t, slotProcs(t, f.D, plain.ID))) {
				t.Errorf("a slot restored ahead without MemoryMerge opted in")
			}
			t.Logf("%s: one slot restored ahead without merging: %.1f MiB", eng, float64(deploytest.PSSKiB(slotProcs(t, f.D, plain.ID)...))/1024)
			if err := f.D.Pool().ReleaseSlot(ctx, plain.ID); err != nil {
				t.Fatal(err)
			}

			a := ahead(merging)
			one := mergedPSS(ctx, t, scanner, merging, a.ID)
			b := ahead(merging)
			two := mergedPSS(ctx, t, scanner, merging, a.ID, b.ID)
			for _, s := range []deploy.Slot{a, b} {
				for _, pid := range appProcs(t, slotProcs(t, merging, s.ID)) {
					if p, err := ksm.ReadProcess("", pid); err != nil || !p.MergeAny {
						t.Errorf("slot %s: app process %d did not opt in (%+v, %v)", s.ID, pid, p, err)
					}
				}
			}
			t.Logf("%s: one slot restored ahead %.1f MiB, two %.1f MiB: the second adds %.0f %% of the first", eng, one, two, 100*(two-one)/one)
			if two-one > one/4 {
				t.Errorf("the second slot adds %.1f MiB to the first one's %.1f MiB; want at most a quarter", two-one, one)
			}
			dep, err := merging.Deploy(ctx, app, deploy.Options{})
			if err != nil {
				t.Fatalf("a deploy that takes a merged slot: %v", err)
			}
			if dep.Slot != a.ID && dep.Slot != b.ID {
				t.Errorf("the deploy took slot %q, not one restored ahead (%s, %s)", dep.Slot, a.ID, b.ID)
			}
			for i := range 12 {
				if got := getToken(t, dep); len(want) != 64 || got != want {
					t.Fatalf("GET %d of a merged slot's instance = %q; want the checkpoint's digest %q", i, got, want)
				}
			}
		})
	}
}

// scannerOn turns the node's scanner on, fast, for the test, and puts its
// settings back after it.
func scannerOn(t *testing.T) ksm.Node {
	t.Helper()
	n, err := deploytest.ScannerOn(t, ksm.Settings{PagesToScan: 4000})
	if errors.Is(err, ksm.ErrUnavailable) {
		testenv.Unavailable(t, testenv.Root, "no same-page merging on this kernel: "+err.Error())
	} else if err != nil {
		t.Fatal(err)
	}
	if err := ksm.SetSelf(true); errors.Is(err, ksm.ErrUnavailable) {
		testenv.Unavailable(t, testenv.Root, err.Error())
	}
	_ = ksm.SetSelf(false)
	return n
}

// mergedPSS waits until the scanner has been over everything twice, and
// returns the proportional set size of the slots' processes, in MiB: what
// they cost the node.
func mergedPSS(ctx context.Context, t *testing.T, n ksm.Node, d *deploy.Deployer, ids ...string) float64 {
	t.Helper()
	t0 := time.Now()
	st, err := n.Settle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("merging settled in %s: %d pages sharing %d", time.Since(t0).Round(time.Millisecond), st.PagesSharing, st.PagesShared)
	var kb uint64
	for _, id := range ids {
		for _, pid := range slotProcs(t, d, id) {
			pss := deploytest.PSSKiB(pid)
			kb += pss
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			p, _ := ksm.ReadProcess("", pid)
			t.Logf("slot %s: %d %s: pss %d KiB, merge_any %v, %d merging pages", id, pid, strings.TrimSpace(string(comm)), pss, p.MergeAny, p.MergingPages)
		}
	}
	return float64(kb) / 1024
}

// slotProcs lists the host PIDs of instance id's processes.
func slotProcs(t *testing.T, d *deploy.Deployer, id string) []int {
	t.Helper()
	pids, err := deploytest.InstanceProcs(d, id)
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// anyMerging reports whether any of pids opted in.
func anyMerging(pids []int) bool {
	for _, pid := range pids {
		if p, err := ksm.ReadProcess("", pid); err == nil && p.MergeAny {
			return true
		}
	}
	return false
}

// appProcs are the app's processes among pids (python3: the prefork
// server's parent and three children), not the supervisor's.
func appProcs(t *testing.T, pids []int) []int {
	t.Helper()
	var app []int
	for _, pid := range pids {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
		// DMTCP names a process it restored "DMTCP:" and its name.
		if strings.HasPrefix(strings.TrimPrefix(strings.TrimSpace(string(b)), "DMTCP:"), "python3") {
			app = append(app, pid)
		}
	}
	if len(app) < 4 {
		var comms []string
		for _, pid := range pids {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
			comms = append(comms, strconv.Itoa(pid)+":"+strings.TrimSpace(string(b)))
		}
		t.Fatalf("the app's processes among %v: %v; want its parent and three children", comms, app)
	}
	return app
}
