// Package docs checks what the project's documents name against the code:
// every config key and metric a page names exists, so that an operator who
// follows a page sets a key the agent reads and graphs a metric it serves.
package docs

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/internal/config"
	"github.com/fogdeploy/fogdeploy/internal/deploy/deploytest"
)

// pages are the documents an operator reads.
func pages(t *testing.T) map[string]string {
	t.Helper()
	root := deploytest.RepoRoot()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"), filepath.Join(root, "dmtcp-image", "README.md"))
	out := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		out[rel] = string(b)
	}
	if len(out) < 5 {
		t.Fatalf("found %d pages: the check would read nothing", len(out))
	}
	return out
}

// configKeys are the dotted keys of config.Config's YAML (agent.pool_size).
func configKeys() map[string]bool {
	keys := map[string]bool{}
	var walk func(prefix string, ty reflect.Type)
	walk = func(prefix string, ty reflect.Type) {
		for f := range ty.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			key := name
			if prefix != "" {
				key = prefix + "." + name
			}
			keys[key] = true
			if ft := f.Type; ft.Kind() == reflect.Struct && !strings.HasPrefix(ft.PkgPath(), "time") {
				walk(key, ft)
			}
		}
	}
	walk("", reflect.TypeFor[config.Config]())
	return keys
}

// keyRef is a config key in backticks, maybe with its value: `agent.fetch: sealed`.
var keyRef = regexp.MustCompile("`((?:ceph|mapper|layering|docker|node|etcd|agent|limits|pop)\\.[a-z_.]+)[`:]")

// fileNames are names of that form that are files, not keys.
var fileNames = []string{"agent.log", "ceph.log", "layering.txt"}

func TestDocsNameConfigKeys(t *testing.T) {
	keys := configKeys()
	if !keys["agent.spare_slots"] || !keys["layering.build_host_network"] {
		t.Fatalf("config keys %v: the walk of config.Config missed known ones", len(keys))
	}
	n := 0
	for page, text := range pages(t) {
		for _, m := range keyRef.FindAllStringSubmatch(text, -1) {
			key := strings.TrimSuffix(m[1], ".")
			if slices.Contains(fileNames, key) {
				continue
			}
			n++
			if !keys[key] {
				t.Errorf("%s names config key %s, which the config does not have", page, key)
			}
		}
	}
	if n < 20 {
		t.Errorf("the pages name %d config keys: the check read too little", n)
	}
}

// metricRef is a metric name a page gives, maybe in the shell's brace
// form (fogdeploy_pool_{hits,misses}_total); braces after a letter are
// labels (fogdeploy_pool_hits_total{ahead}).
var metricRef = regexp.MustCompile(`\b(fogdeploy_[a-z_]*)(?:\{([a-z_,]+)\}([a-z_]*))?`)

// metricNames expands one metricRef match into the names it stands for.
func metricNames(m []string) []string {
	if m[2] == "" || !strings.HasSuffix(m[1], "_") {
		return []string{m[1]}
	}
	var names []string
	for alt := range strings.SplitSeq(m[2], ",") {
		names = append(names, m[1]+alt+m[3])
	}
	return names
}

// servedMetrics are the names the code registers (Name: "fogdeploy_...").
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	def := regexp.MustCompile(`Name:\s*"(fogdeploy_[a-z_]+)"`)
	root := deploytest.RepoRoot()
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bench") {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// otherMetric is a backticked name of a counter, duration or size that
// is not the project's (fogdeploy_...): one a page misnamed.
var otherMetric = regexp.MustCompile("`([a-z][a-z0-9]*_[a-z0-9_]+_(?:total|seconds|bytes))`")

// foreignCounters are Ceph's own counters that pages cite.
var foreignCounters = []string{"op_r_out_bytes", "op_w_in_bytes"}

func TestDocsNameServedMetrics(t *testing.T) {
	served := servedMetrics(t)
	if len(served) < 10 {
		t.Fatalf("found %d metrics in the code: the check would compare nothing", len(served))
	}
	for page, text := range pages(t) {
		for _, m := range otherMetric.FindAllStringSubmatch(text, -1) {
			if !strings.HasPrefix(m[1], "fogdeploy_") && !slices.Contains(foreignCounters, m[1]) {
				t.Errorf("%s names metric %s: the project's metrics are named fogdeploy_...", page, m[1])
			}
		}
		for _, m := range metricRef.FindAllStringSubmatch(text, -1) {
			for _, name := range metricNames(m) {
				// A histogram's series are its name and _bucket, _sum, _count.
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				if !served[name] && !served[base] {
					t.Errorf("%s names metric %s, which no code serves", page, name)
				}
			}
		}
	}
}
