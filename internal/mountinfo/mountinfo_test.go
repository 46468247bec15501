package mountinfo

import (
	"slices"
	"testing"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/plain`:                  `/plain`,
		`/with\040space`:          `/with space`,
		`/tab\011and\012newline`:  "/tab\tand\nnewline",
		`/back\134slash`:          `/back\slash`,
		`/not\0xyescape`:          `/not\0xyescape`,
		`/short\04`:               `/short\04`,
		`/mnt/a\040b/c\040d\040e`: `/mnt/a b/c d e`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnder(t *testing.T) {
	got, err := Under("/")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "/") {
		t.Errorf("Under(/) = %v; want the root among them", got)
	}
	if got, err := Under(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("Under(a new directory) = %v, %v; want none", got, err)
	}
}
