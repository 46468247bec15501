package cephstore_test

import (
	"os"
	"strings"
	"testing"
)

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func containsStr(s, sub string) bool { return strings.Contains(s, sub) }
