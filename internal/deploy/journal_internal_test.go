package deploy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type note struct {
	Text string `json:"text"`
}

// TestJournalSpare: a record created into a spare reads back as written,
// takes the spare's place, and is refused where the record exists; a
// record without a spare, or longer than one, is created all the same;
// recovery drops the spares of records that are gone.
func TestJournalSpare(t *testing.T) {
	recs := journal[note]{dir: t.TempDir(), what: "deployment", notFound: ErrNotFound}
	spares := journal[note]{dir: t.TempDir(), what: "slot", notFound: ErrNoSlot}
	if err := spares.reserve("s1"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(spares.sparePath("s1")); err != nil || st.Size() != spareSize {
		t.Fatalf("spare after reserve: %v, %v; want a file of %d bytes", st, err, spareSize)
	}
	if l, err := spares.list(); err != nil || len(l) != 0 {
		t.Fatalf("list with only a spare = %v, %v; want no record", l, err)
	}

	if err := recs.createFrom(spares.sparePath("s1"), "d1", &note{"first"}); err != nil {
		t.Fatal(err)
	}
	if got, err := recs.load("d1"); err != nil || got.Text != "first" {
		t.Fatalf("load = %+v, %v; want the record written", got, err)
	}
	if _, err := os.Stat(spares.sparePath("s1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the spare is still there after the record took it: %v", err)
	}

	// The ID is taken: refused, the record as it was, the spare kept.
	if err := spares.reserve("s2"); err != nil {
		t.Fatal(err)
	}
	if err := recs.createFrom(spares.sparePath("s2"), "d1", &note{"second"}); !errors.Is(err, ErrExists) {
		t.Fatalf("createFrom over an existing record = %v, want ErrExists", err)
	}
	if got, _ := recs.load("d1"); got.Text != "first" {
		t.Fatalf("the existing record became %+v", got)
	}
	// Written over once, the spare still makes a whole record.
	if err := recs.createFrom(spares.sparePath("s2"), "d2", &note{"x"}); err != nil {
		t.Fatal(err)
	}
	if got, err := recs.load("d2"); err != nil || got.Text != "x" {
		t.Fatalf("load after a refused attempt = %+v, %v; want the record written", got, err)
	}

	// No spare; a record longer than a spare.
	if err := recs.createFrom(spares.sparePath("none"), "d3", &note{"no spare"}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("y", 2*spareSize)
	if err := spares.reserve("s3"); err != nil {
		t.Fatal(err)
	}
	if err := recs.createFrom(spares.sparePath("s3"), "d4", &note{long}); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"d3": "no spare", "d4": long} {
		if got, err := recs.load(id); err != nil || got.Text != want {
			t.Fatalf("load %s = %.40q, %v", id, got.Text, err)
		}
	}
	if l, err := recs.list(); err != nil || len(l) != 4 {
		t.Fatalf("list = %d records, %v; want 4", len(l), err)
	}

	// Recovery: the spare of a slot whose record is gone goes; one whose
	// record is there stays.
	if err := spares.save("kept", &note{"slot"}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"kept", "orphan"} {
		if err := spares.reserve(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := spares.dropSpares(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spares.sparePath("kept")); err != nil {
		t.Fatalf("dropSpares removed the spare of a record that exists: %v", err)
	}
	if _, err := os.Stat(spares.sparePath("orphan")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dropSpares kept the spare of a record that is gone: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(recs.dir, "*.spare")); len(left) != 0 {
		t.Fatalf("spares in the records' directory: %v", left)
	}
}
