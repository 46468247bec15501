//go:build !no_ceph

package cephstore

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/hint"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// What `ceph osd dump -f json` says is turned into the cause of a stall,
// with a hint.
func TestExplainOSDDump(t *testing.T) {
	for _, tc := range []struct {
		name, dump string
		want       error
		says, hint string
	}{
		{"quota", `{"pools":[{"pool_name":"fogdeploy","flags_names":"hashpspool,full,full_quota,selfmanaged_snaps","quota_max_bytes":1048576}],"osds":[{"osd":0,"up":1}]}`,
			layering.ErrFull, `pool "fogdeploy" is full: its quota (max_bytes 1.0 MiB) is used up`, "set-quota fogdeploy max_bytes"},
		{"osd full", `{"pools":[{"pool_name":"fogdeploy","flags_names":"hashpspool,full"}],"osds":[{"osd":0,"up":1}]}`,
			layering.ErrFull, "an OSD is past its full ratio", "ceph health detail"},
		{"osds down", `{"pools":[{"pool_name":"fogdeploy","flags_names":"hashpspool"}],"osds":[{"osd":0,"up":0},{"osd":1,"up":1},{"osd":2,"up":0}]}`,
			layering.ErrUnavailable, "2 of 3 OSDs down (osd.0, osd.2)", "start the OSDs again"},
		{"another pool full", `{"pools":[{"pool_name":"other","flags_names":"full,full_quota"},{"pool_name":"fogdeploy","flags_names":"hashpspool"}],"osds":[{"osd":0,"up":1}]}`,
			nil, "", ""},
	} {
		var d osdDump
		if err := json.Unmarshal([]byte(tc.dump), &d); err != nil {
			t.Fatal(err)
		}
		err := d.explain("fogdeploy")
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v; want nothing wrong", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says) || !strings.Contains(hint.Of(err), tc.hint) {
			t.Errorf("%s: %v (hint %q); want %v saying %q, hint with %q", tc.name, err, hint.Of(err), tc.want, tc.says, tc.hint)
		}
	}
}
