package instancectl

import (
	"encoding/json"
	"reflect"
	"testing"
)

// The bodies' wire format, which the agent and the entrypoint (two
// binaries, of two builds during an upgrade) must read alike: each field
// under its name, the optional ones left out when empty, and each body
// read back as written.
func TestBodies(t *testing.T) {
	for _, tc := range []struct {
		body any
		want string
		into any
	}{
		{AssignBody{Args: []string{"restart", "-wait", "/fog/ctl/order"}}, `{"args":["restart","-wait","/fog/ctl/order"]}`, &AssignBody{}},
		{CheckpointedBody{Gen: 3, Bytes: 1 << 20, MS: 12.5}, `{"gen":3,"bytes":1048576,"ms":12.5}`, &CheckpointedBody{}},
		{OrderBody{Deployment: "redis-1a2b3c4d", Node: "node1", MemoryMerge: true}, `{"deployment":"redis-1a2b3c4d","node":"node1","memory_merge":true}`, &OrderBody{}},
		{OrderBody{}, `{}`, &OrderBody{}},
		{ReleasedBody{Error: "mounts left under the root"}, `{"error":"mounts left under the root"}`, &ReleasedBody{}},
		{ReleasedBody{}, `{}`, &ReleasedBody{}},
	} {
		b, err := json.Marshal(tc.body)
		if err != nil || string(b) != tc.want {
			t.Errorf("%T %+v = %s, %v; want %s", tc.body, tc.body, b, err, tc.want)
			continue
		}
		if err := json.Unmarshal(b, tc.into); err != nil {
			t.Fatal(err)
		}
		if got := reflect.ValueOf(tc.into).Elem().Interface(); !reflect.DeepEqual(got, tc.body) {
			t.Errorf("%s read back as %+v; want %+v", b, got, tc.body)
		}
	}
	// The files are distinct names of one directory.
	seen := map[string]bool{}
	for _, f := range []string{Order, Timings, Release, Released, Rearm, Checkpointed, IdentityDir, IdentityBound, Assign} {
		if f == "" || seen[f] {
			t.Errorf("control file %q is empty or named twice", f)
		}
		seen[f] = true
	}
}
