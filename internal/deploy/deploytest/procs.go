package deploytest

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/deploy"
	"github.com/fogdeploy/fogdeploy/internal/testenv"
)

// InstanceProcs lists the host PIDs of the processes of an instance: slot
// id's, or deployment id's. They are its container's main process and
// every descendant.
func InstanceProcs(d *deploy.Deployer, id string) ([]int, error) {
	slots, err := d.Pool().Slots()
	if err != nil {
		return nil, err
	}
	root := 0
	for _, s := range slots {
		if s.ID == id && s.Handle != nil {
			root = s.Handle.Pid
		}
	}
	recs, err := d.Records().List()
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		if r.ID == id && r.Handle != nil {
			root = r.Handle.Pid
		}
	}
	if root == 0 {
		return nil, fmt.Errorf("instance %s: no process known", id)
	}
	pids := []int{root}
	for _, p := range testenv.DescendantsOf(root) {
		pids = append(pids, p.PID)
	}
	return pids, nil
}

// PSSKiB is the proportional set size of pids in KiB: the node's memory
// they hold, each page shared by n processes counted 1/n for each. A
// process gone meanwhile counts for nothing.
func PSSKiB(pids ...int) uint64 {
	var kb uint64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "Pss:" {
				v, _ := strconv.ParseUint(f[1], 10, 64)
				kb += v
			}
		}
	}
	return kb
}
