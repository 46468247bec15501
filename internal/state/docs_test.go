package state

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/spec"
)

// TestAPIDocMatchesStatus: the phases and the status fields docs/api.md
// names are those a deployment's status has.
func TestAPIDocMatchesStatus(t *testing.T) {
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)

	// The phases: the paragraph that starts with `status.phase`.
	i := strings.Index(doc, "`status.phase` goes")
	if i < 0 {
		t.Fatal("docs/api.md has no paragraph on `status.phase`")
	}
	para, _, _ := strings.Cut(doc[i:], "\n\n")
	var named []spec.Phase
	for _, m := range regexp.MustCompile("`([A-Z][a-z]+)`").FindAllStringSubmatch(para, -1) {
		if p := spec.Phase(m[1]); !slices.Contains(named, p) {
			named = append(named, p)
		}
	}
	for _, p := range named {
		if !slices.Contains(spec.StatusPhases, p) {
			t.Errorf("docs/api.md names phase %q, which a status never takes (%v)", p, spec.StatusPhases)
		}
	}
	for _, p := range spec.StatusPhases {
		if !slices.Contains(named, p) {
			t.Errorf("docs/api.md leaves out phase %q", p)
		}
	}

	// The fields: every status.FIELD is a JSON field of Status.
	fields := map[string]bool{}
	for _, f := range reflect.VisibleFields(reflect.TypeOf(Status{})) {
		if f.Anonymous {
			continue // its fields are inlined, and listed too
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		fields[name] = true
	}
	for _, m := range regexp.MustCompile("`status\\.([a-z_]+)").FindAllStringSubmatch(doc, -1) {
		if !fields[m[1]] {
			t.Errorf("docs/api.md names status.%s, which Status has no field for", m[1])
		}
	}
}
