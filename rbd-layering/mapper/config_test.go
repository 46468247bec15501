package mapper_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fogdeploy/fogdeploy/rbd-layering/mapper"
)

func TestConfigValidate(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "ceph.conf")
	if err := os.WriteFile(conf, []byte("[global]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	filePath := func(mapper.Image) (string, error) { return "", nil }
	tests := []struct {
		name string
		cfg  mapper.Config
		want []string // substrings, one per expected problem; nil = valid
	}{
		{"auto ok", mapper.Config{StateDir: dir, CephConf: conf}, nil},
		{"fuse ok", mapper.Config{Backend: "fuse", StateDir: dir, CephConf: conf, Keyring: conf, ID: "admin"}, nil},
		{"file ok", mapper.Config{Backend: "file", StateDir: dir, FilePath: filePath}, nil},
		{"zero", mapper.Config{}, []string{"Config.StateDir is empty", "Config.CephConf is empty"}},
		{"relative state dir", mapper.Config{StateDir: "state", CephConf: conf}, []string{"Config.StateDir \"state\" is relative"}},
		{"unknown backend", mapper.Config{Backend: "iscsi", StateDir: dir}, []string{"Config.Backend \"iscsi\" is unknown: use one of auto, krbd, nbd, fuse, file"}},
		{"file without FilePath", mapper.Config{Backend: "file", StateDir: dir}, []string{"Config.FilePath is nil"}},
		{"missing files", mapper.Config{Backend: "krbd", StateDir: dir, CephConf: dir + "/nope.conf", Keyring: dir + "/nope.keyring"},
			[]string{"Config.CephConf \"" + dir + "/nope.conf\" does not exist", "Config.Keyring \"" + dir + "/nope.keyring\" does not exist"}},
		{"client. prefix", mapper.Config{StateDir: dir, CephConf: conf, ID: "client.admin"}, []string{"Config.ID \"client.admin\" starts with \"client.\""}},
		{"negative timeout", mapper.Config{StateDir: dir, CephConf: conf, Timeout: -1}, []string{"Config.Timeout -1ns is negative"}},
		{"everything wrong", mapper.Config{Backend: "nbd", StateDir: "rel", ID: "client.x", Timeout: -1},
			[]string{"Config.StateDir", "Config.CephConf", "Config.ID", "Config.Timeout"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, mapper.ErrInvalid) {
				t.Fatalf("Validate() = %v, want ErrInvalid", err)
			}
			var joined interface{ Unwrap() []error }
			if !errors.As(err, &joined) || len(joined.Unwrap()) != len(tt.want) {
				t.Fatalf("Validate() = %q, want %d problems", err, len(tt.want))
			}
			for i, w := range tt.want {
				if msg := joined.Unwrap()[i].Error(); !strings.Contains(msg, w) {
					t.Errorf("problem %d = %q, want it to contain %q", i, msg, w)
				}
			}
		})
	}
}

func TestImageValidate(t *testing.T) {
	for _, img := range []mapper.Image{
		{Pool: "p", Name: "a"},
		{Pool: "p", Name: "a", Snap: "s"},
	} {
		if err := img.Validate(); err != nil {
			t.Errorf("%s: %v", img, err)
		}
	}
	for _, img := range []mapper.Image{
		{Name: "a"},
		{Pool: "p"},
		{Pool: "p", Name: "a/b"},
		{Pool: "p", Name: "a@s"},
		{Pool: "p", Name: "a", Snap: "s s"},
	} {
		if err := img.Validate(); !errors.Is(err, mapper.ErrInvalid) {
			t.Errorf("%+v: Validate() = %v, want ErrInvalid", img, err)
		}
	}
	if got := (mapper.Image{Pool: "p", Name: "a", Snap: "s"}).String(); got != "p/a@s" {
		t.Errorf("String() = %q", got)
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	_, err := mapper.New(t.Context(), mapper.Config{Backend: "file"}, nil)
	if !errors.Is(err, mapper.ErrInvalid) {
		t.Fatalf("New with an invalid config: %v, want ErrInvalid", err)
	}
}
